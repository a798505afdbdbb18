"""The recipe's flops profiler: profiles the optimizer step that starts at global step flops_profiler.profile_step.

    python -m dsrecipes model=gpt_debug flops_profiler=enabled flops_profiler.profile_step=3 flops_profiler.module_depth=2

(DeepSpeed's counting: profile_step=0 is the first step, the default 1 the second.) At that step
every rank counts (dsrecipes.profiling.flops_profiler) the FLOPs of its forward passes per module,
with module latencies, and the FLOPs of its backward passes (activation recomputation included),
through the Engine's step phases. Rank 0 then prints the profile (rich) and writes it to
<run dir>/flops_profile.md and .json (or flops_profiler.output_file): parameters, forward FLOPs and
MACs, FLOPs per token (forward, and forward+backward beside the model's analytic flops_per_token),
the step's latency, achieved FLOP/s and MFU against trainer.peak_tflops (or a known GPU's peak).
All figures are this rank's (under ZeRO-3 and tensor / pipeline parallelism, its shard of the model; the
whole model's parameter count is printed beside this rank's). A
pipeline-parallel run is not profiled (its schedule runs forward and backward as one phase); a run
resumed past profile_step neither: each says so in one warning.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from dsrecipes.profiling.config import FlopsProfilerConfig
from dsrecipes.profiling.flop_formulas import flop_counter
from dsrecipes.profiling.flops_profiler import FlopsProfiler, duration_to_string, number_to_string
from dsrecipes.profiling.model_profile import profile_data, profile_tables, write_profile
from dsrecipes.training.extensions.base import Callback, RunContext
from dsrecipes.utils.console import make_console, print_table
from dsrecipes.utils.device import peak_tflops
from dsrecipes.utils.logging import get_logger

PROFILE_FILE = "flops_profile.md"


class FlopsProfilerCallback(Callback):
    def __init__(self, cfg: FlopsProfilerConfig):
        self.cfg = cfg
        self.profiler: FlopsProfiler | None = None
        self.backward_flops = 0
        self.result: dict | None = None  # the raw totals once the step is profiled

    # ------------------------------------------------------------------ when
    def on_train_start(self, context: RunContext) -> None:
        step = context.engine.global_steps
        if not context.engine.plan.separate_forward_backward:
            get_logger().warning("flops_profiler: not run under pipeline parallelism (parallel.pp=%d): the schedule "
                                 "runs forward and backward as one phase", context.cfg.parallel.pp)
        elif step > self.cfg.profile_step:
            get_logger().warning("flops_profiler: profile_step=%d has already run (the run resumed at step %d); no "
                                 "profile", self.cfg.profile_step, step)
        elif step == self.cfg.profile_step:
            self._start(context)

    def on_step_end(self, context: RunContext, step: int, metrics: dict) -> None:
        """step: global_steps after the step; the profiled one is the step after global_steps == profile_step."""
        if self.profiler is not None:
            self._finish(context, step)
        elif step == self.cfg.profile_step and context.engine.plan.separate_forward_backward:
            self._start(context)

    # ------------------------------------------------------------------ how
    def _observe(self, phase: str):
        if phase == "forward":
            return self.profiler.counting()
        if phase == "backward":
            return self._count_backward()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _count_backward(self):
        with flop_counter() as counter:
            yield
        self.backward_flops += counter.get_total_flops()

    def _now(self, device: torch.device) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def _start(self, context: RunContext) -> None:
        engine = context.engine
        self.profiler = FlopsProfiler(engine.module, context.device)
        self.profiler.start_profile()
        self.backward_flops = 0
        engine.phases.add(self._observe)
        self._started = self._now(context.device)

    def _finish(self, context: RunContext, step: int) -> None:
        step_s = self._now(context.device) - self._started
        context.engine.phases.remove(self._observe)
        profiler, self.profiler = self.profiler, None
        profiler.stop_profile()
        totals, shown = self._totals(context, profiler, step, step_s)
        self.result = totals
        if not context.is_logging_rank:
            return
        cfg = self.cfg
        tables = profile_tables(profiler, f"flops profile of optimizer step {step} (profile_step={step - 1}; rank 0)",
                                shown, cfg.module_depth,
                                cfg.top_modules, cfg.detailed)
        console = make_console()
        for table in tables:
            print_table(console, table)
        markdown, json_path = write_profile(tables, profile_data(profiler, totals, cfg.module_depth, cfg.top_modules),
                                            self._output_path(context.run_dir))
        get_logger().info("flops_profiler: %s, %s", markdown, json_path)

    def _output_path(self, run_dir: Path) -> Path:
        if not self.cfg.output_file:
            return run_dir / PROFILE_FILE
        path = Path(self.cfg.output_file)
        return path if path.is_absolute() else run_dir / path

    def _totals(self, context: RunContext, profiler: FlopsProfiler, step: int, step_s: float) -> tuple[dict, dict]:
        """The raw numbers (JSON) and their display strings (the totals table)."""
        forward, backward, tokens = profiler.total_flops, self.backward_flops, profiler.tokens
        peak = peak_tflops(context.device, context.cfg.trainer.peak_tflops)
        achieved = (forward + backward) / max(step_s, 1e-12)
        raw = {
            "step": step, "parameters": profiler.get_total_params(), "model_parameters": profiler.get_model_params(),
            "forward_flops": forward,
            "forward_macs": forward // 2, "backward_flops": backward, "tokens": tokens,
            "forward_flops_per_token": forward / tokens if tokens else None,
            "step_flops_per_token": (forward + backward) / tokens if tokens else None,
            "deepspeed_estimate_step_flops": forward * (3 + self.cfg.recompute_fwd_factor),
            "forward_latency_s": profiler.get_total_duration(), "step_latency_s": step_s,
            "achieved_flops_per_s": achieved, "peak_tflops": peak,
            "mfu": achieved / (peak * 1e12) if peak else None,
            "analytic_flops_per_token": _analytic_flops_per_token(context),
        }
        shown = {
            "optimizer step (global_steps after it)": str(step),
            "parameters (this rank)": number_to_string(raw["parameters"], ""),
            "parameters (whole model)": number_to_string(raw["model_parameters"], ""),
            "forward FLOPs": number_to_string(forward, "FLOPs"),
            "forward MACs": number_to_string(forward // 2, "MACs"),
            "backward FLOPs (recomputation included)": number_to_string(backward, "FLOPs"),
            f"DeepSpeed's estimate fwd x (3 + recompute_fwd_factor={self.cfg.recompute_fwd_factor:g})":
                number_to_string(raw["deepspeed_estimate_step_flops"], "FLOPs"),
            "tokens (forward)": f"{tokens:,}",
        }
        if tokens:
            shown["forward FLOPs per token"] = number_to_string(raw["forward_flops_per_token"], "FLOPs")
            shown["fwd+bwd FLOPs per token"] = number_to_string(raw["step_flops_per_token"], "FLOPs")
        if raw["analytic_flops_per_token"]:
            shown["analytic fwd+bwd FLOPs per token (model.flops_per_token)"] = number_to_string(
                raw["analytic_flops_per_token"], "FLOPs")
        shown["forward latency"] = duration_to_string(raw["forward_latency_s"])
        shown["step latency"] = duration_to_string(step_s)
        shown["achieved FLOP/s (fwd+bwd / step latency)"] = number_to_string(achieved, "FLOP/s")
        shown["MFU"] = f"{100 * raw['mfu']:.2f}% of {peak:g} TFLOP/s" if peak else "- (set trainer.peak_tflops)"
        return raw, shown


def _analytic_flops_per_token(context: RunContext) -> float | None:
    """The whole model's 6N + 12LdT (dsrecipes.models.GPT.flops_per_token) at data.block_size, when it has one."""
    for module in context.engine.module.modules():
        if hasattr(module, "flops_per_token") and hasattr(module, "cfg"):
            return float(module.flops_per_token(context.cfg.data.block_size))
    return None
