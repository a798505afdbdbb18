"""Which candidates can fit, decided before any trial runs: dsrecipes' memory estimator against a per-rank cap.

Per rank, a candidate needs (dsrecipes.profiling.memory_estimator):

    model states (estimate_model_states: parameters, gradients, optimizer states of the strategy its
                  zero.stage runs on, over its data-parallel ranks)
  + micro_batch x activations of one sample (estimate_activations: linear in the micro-batch)

With CPU offload (FSDP2's CPUOffloadPolicy) the device keeps no model states at rest, only about two blocks'
unsharded fp32 parameters in flight. Model parallelism (parallel.tp / pp / sp) is approximated: parameters
and activations split over tp x pp (pipeline stages hold 1/pp of the layers but ~pp micro-batches in
flight under 1F1B, which cancel), sequence parallelism splits the activations over sp.

Because the need is linear in the micro-batch, the largest micro-batch that fits a group is one division;
each group then tries `num_tuning_micro_batch_sizes` sizes up to it. A user's maximum above that is listed
as rejected ("rejected: needs X GiB > cap Y GiB"), and a group whose smallest size does not fit is rejected
whole; if no group fits: "no candidate fits in X GiB; smallest needs Y GiB".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from dsrecipes.profiling.autotuning.space import Candidate, Group, micro_batch_sizes
from dsrecipes.profiling.memory_estimator import estimate_activations, estimate_model_states

GIB = 2**30


def gib(nbytes: float) -> str:
    """Bytes as GiB with 4 significant digits (tiny test caps stay readable): '0.01953', '79.19'."""
    return f"{nbytes / GIB:.4g}"


@dataclass(frozen=True)
class RecipeMemory:
    """What the estimate needs from a recipe: the model's shape, precision, optimizer and parallel degrees."""

    num_params: int
    n_layer: int
    d_model: int
    ffn_dim: int
    vocab_size: int
    seq_len: int
    style: str = "gpt2"
    precision: str = "fp32"
    master_weights: bool = False
    optimizer: str = "adamw"
    momentum: float = 0.0
    bf16_masters: bool = False  # precision.master_dtype=bf16: no fp32 copy, bf16 optimizer state
    tp: int = 1
    pp: int = 1
    sp: int = 1

    @property
    def activation_bytes(self) -> int:
        return 2 if self.precision in ("bf16", "fp16") else 4

    def data_parallel(self, world_size: int) -> int:
        return max(world_size // (self.tp * self.pp * self.sp), 1)


@dataclass(frozen=True)
class MemoryNeed:
    """Per-rank bytes of one candidate, and the cap it is held against."""

    model_states: float
    activations: float
    cap: float
    world_size: int

    @property
    def total(self) -> float:
        return self.model_states + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.cap


@dataclass(frozen=True)
class Rejection:
    candidate: Candidate
    need: MemoryNeed | None
    reason: str  # shown in the results: "rejected: needs X GiB > cap Y GiB" or "invalid: <the recipe's error>"


class NoCandidateFits(ValueError):
    """Every candidate is over the memory cap (a user error: raise the cap or lower the micro-batch minimum)."""


def model_state_bytes(recipe: RecipeMemory, group: Group, world_size: int) -> float:
    """Per-rank model-state bytes on the device for a group (its stage over the recipe's data-parallel ranks)."""
    params = recipe.num_params / (recipe.tp * recipe.pp)
    if group.offload != "none":  # FSDP2 CPU offload: states on the CPU, ~two blocks' fp32 parameters in flight
        return 2 * 4 * params / max(recipe.n_layer, 1)
    states = estimate_model_states(int(params), recipe.data_parallel(world_size), group.zero_stage, recipe.precision,
                                   recipe.master_weights, recipe.optimizer, recipe.momentum,
                                   bf16_masters=recipe.bf16_masters)
    return states.total


def activation_bytes_per_sample(recipe: RecipeMemory, group: Group, recipe_checkpointing: bool) -> float:
    """Activation bytes one sample of a micro-batch adds on one rank."""
    checkpointing = recipe_checkpointing if not group.activation_checkpointing else group.activation_checkpointing == "full"
    one = estimate_activations(1, recipe.seq_len, recipe.n_layer, recipe.d_model, recipe.ffn_dim, recipe.vocab_size,
                               recipe.style, recipe.activation_bytes, checkpointing)
    return one.total / (recipe.tp * recipe.sp)


def memory_need(recipe: RecipeMemory, candidate: Candidate, world_size: int, cap: float,
                recipe_checkpointing: bool = False) -> MemoryNeed:
    group = candidate.group
    per_sample = activation_bytes_per_sample(recipe, group, recipe_checkpointing)
    return MemoryNeed(model_state_bytes(recipe, group, world_size), candidate.micro_batch * per_sample, cap, world_size)


def largest_fitting_micro_batch(recipe: RecipeMemory, group: Group, world_size: int, cap: float,
                                recipe_checkpointing: bool = False) -> int:
    """The largest micro-batch whose estimate is within `cap` (0: not even one sample fits)."""
    free = cap - model_state_bytes(recipe, group, world_size)
    per_sample = activation_bytes_per_sample(recipe, group, recipe_checkpointing)
    return max(int(math.floor(free / per_sample)), 0) if free > 0 else 0


@dataclass
class Plan:
    """Candidates to run (grid order, each with its estimate) and those rejected before any trial."""

    candidates: list[tuple[Candidate, MemoryNeed]]
    rejected: list[Rejection]


def plan_candidates(
    recipe: RecipeMemory,
    groups: list[Group],
    low: int,
    high: int,
    count: int,
    world_size_of: Callable[[Group], int],
    cap_of: Callable[[int], float],
    recipe_checkpointing: bool = False,
) -> Plan:
    """Per group: `count` micro-batch sizes from `low` up to min(high, the largest that fits); what is over the cap
    is rejected. Raises NoCandidateFits when nothing fits."""
    planned: list[tuple[Candidate, MemoryNeed]] = []
    rejected: list[Rejection] = []
    for group in groups:
        world = world_size_of(group)
        cap = cap_of(world)
        fitting = min(high, largest_fitting_micro_batch(recipe, group, world, cap, recipe_checkpointing))
        for micro in micro_batch_sizes(low, fitting, count):
            candidate = Candidate(group.zero_stage, group.activation_checkpointing, group.offload, micro)
            planned.append((candidate, memory_need(recipe, candidate, world, cap, recipe_checkpointing)))
        over = low if fitting < low else (high if high > fitting else None)
        if over is not None:
            candidate = Candidate(group.zero_stage, group.activation_checkpointing, group.offload, over)
            need = memory_need(recipe, candidate, world, cap, recipe_checkpointing)
            rejected.append(Rejection(candidate, need, f"rejected: needs {gib(need.total)} GiB > cap {gib(cap)} GiB"))
    if not planned:
        smallest = min(rejected, key=lambda r: r.need.total)
        caps = sorted({r.need.cap for r in rejected})
        cap_text = gib(caps[0]) if len(caps) == 1 else f"{gib(caps[0])}-{gib(caps[-1])}"
        raise NoCandidateFits(
            f"no candidate fits in {cap_text} GiB; smallest needs {gib(smallest.need.total)} GiB "
            f"({smallest.candidate.label}: model states {gib(smallest.need.model_states)} GiB + activations "
            f"{gib(smallest.need.activations)} GiB); raise hydra.sweeper.max_memory_gib, lower "
            "hydra.sweeper.min_train_micro_batch_size_per_gpu, or add stages/checkpointing to the search")
    return Plan(planned, rejected)
