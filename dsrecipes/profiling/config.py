"""Schemas of the `flops_profiler` and `profiler` config groups, and their checks against the run length.

    python -m dsrecipes model=gpt_debug flops_profiler=enabled flops_profiler.profile_step=5
    python -m dsrecipes model=gpt_debug profiler=trace profiler.wait=2 profiler.active=3

flops_profiler carries DeepSpeed's keys (reference: DeepSpeed's `flops_profiler` block) with its
defaults; one deliberate difference: enabling it does not also turn on the wall-clock breakdown
(DeepSpeed forces `wall_clock_breakdown` on), because the profiled step times itself and the
breakdown synchronises the device on every step; set trainer.wall_clock_breakdown=true for both.
profiler is torch.profiler's schedule (wait / warmup / active / repeat) and its recording options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsrecipes.utils.inactive_rules import Inactive, switched_off
from dsrecipes.utils.ranges import COUNT, NON_NEGATIVE, POSITIVE_INT, at_least, ranged
from dsrecipes.utils.recipe_facts import RecipeFacts


@dataclass
class FlopsProfilerConfig:
    """DeepSpeed's flops_profiler block: one optimizer step profiled, a per-module table of parameters,
    forward FLOPs / MACs and latency written to the run directory (flops_profile.md / .json, or output_file).

    profile_step counts as DeepSpeed's engine does: the step that starts when global_steps (optimizer
    steps done) equals it, so 0 is the first step and the default 1 the second (the first pays
    one-off warm-up costs). It must be < trainer.max_steps.
    """

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        switched_off(hint=" (choose flops_profiler=enabled)"),
    )

    enabled: bool = False
    profile_step: int = ranged(1, COUNT)  # the step starting at global_steps == profile_step (0 = the first)
    module_depth: int = ranged(-1, at_least(-1))  # deepest module level in the per-module table; -1 = every level
    top_modules: int = ranged(1, POSITIVE_INT)  # the top N modules by forward FLOPs and by latency at each depth
    detailed: bool = True  # print the per-module table (the totals are always printed)
    output_file: str | None = None  # null = <run dir>/flops_profile.md; relative paths are inside the run dir
    # extra forward passes recomputed in backward (activation checkpointing) counted into the
    # fwd+bwd FLOPs of DeepSpeed's estimate, 2 x fwd for backward; dsrecipes counts backward's FLOPs
    # itself, recomputation included, and reports this estimate beside the measured figure
    recompute_fwd_factor: float = ranged(0.0, NON_NEGATIVE)

    def check(self, facts: RecipeFacts) -> None:
        """The profiled step against trainer.max_steps."""
        validate_flops_profiler_config(self, facts.root.trainer.max_steps)


@dataclass
class ProfilerConfig:
    """torch.profiler traces of chosen optimizer steps, written to <run dir>/profiler/ with
    tensorboard_trace_handler (TensorBoard's profiler plugin, Perfetto or chrome://tracing read them).

    Schedule (torch.profiler.schedule): skip `wait` steps, warm up for `warmup`, record `active`,
    and do that `repeat` times (0 = until the run ends). memory_snapshot (CUDA only; on a CPU run a
    warning says it is skipped): torch.cuda.memory's allocation history over the first cycle's warmup
    and active steps, dumped to <run dir>/profiler/memory_snapshot_rank<R>.pickle
    (open it at https://pytorch.org/memory_viz).
    """

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        switched_off(hint=" (choose profiler=trace)"),
        Inactive(lambda root, p: not p.memory_snapshot, lambda root, path: "profiler.memory_snapshot=false",
                 keys=("memory_snapshot_max_entries",)),
    )

    enabled: bool = False
    wait: int = ranged(1, COUNT)
    warmup: int = ranged(1, COUNT)
    active: int = ranged(2, POSITIVE_INT)
    repeat: int = ranged(1, COUNT)
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    memory_snapshot: bool = False
    memory_snapshot_max_entries: int = ranged(100_000, POSITIVE_INT)  # allocation events kept by _record_memory_history

    def check(self, facts: RecipeFacts) -> None:
        """The traced steps against trainer.max_steps."""
        validate_profiler_config(self, facts.root.trainer.max_steps)


def validate_flops_profiler_config(flops: FlopsProfilerConfig, max_steps: int) -> None:
    """The profiled step must be a step of the run (ranges are checked on the fields)."""
    if flops.enabled and flops.profile_step >= max_steps:
        raise ValueError(
            f"flops_profiler.profile_step={flops.profile_step} is beyond trainer.max_steps={max_steps}: the profiled "
            f"step starts at global step {flops.profile_step} (DeepSpeed's counting: 0 = the first step) and would "
            f"never run; choose a profile_step in [0, {max_steps - 1}] or raise trainer.max_steps"
        )


def validate_profiler_config(profiler: ProfilerConfig, max_steps: int) -> None:
    """A trace records at least one step, and one of the run's."""
    if profiler.enabled and profiler.active < 1:
        raise ValueError(f"profiler.active={profiler.active} must be >= 1: a trace records `active` steps")
    if profiler.enabled and profiler.wait + profiler.warmup >= max_steps:
        raise ValueError(
            f"profiler.wait={profiler.wait} + profiler.warmup={profiler.warmup} leaves no step of "
            f"trainer.max_steps={max_steps} to record; lower them or raise trainer.max_steps"
        )


def validate_profiling_config(flops: FlopsProfilerConfig, profiler: ProfilerConfig, max_steps: int) -> None:
    """Both profiling groups against trainer.max_steps."""
    validate_flops_profiler_config(flops, max_steps)
    validate_profiler_config(profiler, max_steps)
