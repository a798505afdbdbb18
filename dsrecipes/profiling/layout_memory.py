"""Per-rank model states of a parallel layout (tp, pp, sp, ep next to data parallelism), from parameter shapes.

    layout = estimate_layout(gpt_on_meta, cfg, dims)   # dims: ParallelDims.from_config(cfg, world_size)
    layout.heaviest                                      # the rank holding the most: its bytes and counts
    layout.for_rank(global_rank)                         # any rank's figures (the tests measure every rank)

What a rank holds is asked of the layout (dsrecipes.distributed.parameter_placement: which parameter elements
tensor, pipeline and expert parallelism leave on each rank, by the rules the run itself applies); this module
turns the counts into bytes:

- experts: kept out of DDP and FSDP2 (ignored parameters), so held whole on their rank (replicated over the
  edp peers): parameters, gradients and optimizer states (zero1_boundary partitions their optimizer states
  over the edp peers). FSDP2 leaves them in fp32.
- the rest: the data-parallel strategy the engine's choice table picks for this config and layout
  (`choose_strategy`) shards it: `model_state_bytes` over `shard_ranks(dims)` ranks (dp for ZeRO-1/2 and
  zero1_boundary, dp_shard x sp for FSDP2, 1 for DDP, the pipeline's all-reduce or a single data-parallel rank).

Not modelled: activations (not model states), FSDP2's padding of uneven shards (< 1 row per tensor),
its transient unsharded parameters, communication buckets, and CPU offload's placement (offloaded
states are counted here as held, wherever they live).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from dsrecipes.distributed.data_parallel import STRATEGIES, DataParallelStrategy, choose_strategy
from dsrecipes.distributed.parallel_dims import ParallelDims
from dsrecipes.distributed.parameter_placement import ParameterPlacement
from dsrecipes.profiling.memory_estimator import _DTYPE_BYTES, weight_bytes
from dsrecipes.training.optim.state_bytes import optimizer_state_of
from dsrecipes.training.precision import steps_bf16_masters


@dataclass(frozen=True)
class RankStates:
    """One rank's model states at rest (after an optimizer step, gradients present), in bytes."""

    pp_rank: int
    tp_rank: int
    dense_params: int  # parameter elements on this rank that data parallelism replicates or shards
    expert_params: int  # elements of this rank's experts (held whole)
    parameters: float
    gradients: float
    optimizer_states: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer_states

    @property
    def num_params(self) -> int:
        return self.dense_params + self.expert_params


@dataclass(frozen=True)
class LayoutEstimate:
    dims: ParallelDims
    stage: int
    strategy: str  # the data-parallel strategy's name (dsrecipes.distributed.data_parallel.STRATEGIES)
    shard_ranks: int  # over how many ranks it shards the dense parameters' states
    ranks: tuple[RankStates, ...]  # one per (pipeline rank, tensor-parallel rank)

    @property
    def heaviest(self) -> RankStates:
        return max(self.ranks, key=lambda r: (r.total, -r.pp_rank, -r.tp_rank))

    def for_rank(self, rank: int) -> RankStates:
        """The figures of global rank `rank` (world = pp x dp x sp x tp, tp innermost, pp outermost)."""
        pp_rank, tp_rank = self.dims.model_parallel_coordinates(rank)
        return next(r for r in self.ranks if (r.pp_rank, r.tp_rank) == (pp_rank, tp_rank))

    def title(self) -> str:
        return self.dims.describe_degrees()


# ---------------------------------------------------------------------------------------------------
# The estimate
# ---------------------------------------------------------------------------------------------------


def estimate_layout(gpt: nn.Module, cfg, dims: ParallelDims) -> LayoutEstimate:
    """Per-rank bytes of parameters, gradients and optimizer states for `gpt` (on the meta device,
    unsharded, built with the recipe's moe group) under the recipe `cfg` (its zero, parallel,
    precision and optimizer groups) at layout `dims`."""
    zero, precision, optimizer = cfg.zero, cfg.precision, cfg.optimizer
    name = choose_strategy(zero, dims, optimizer.name)
    strategy = STRATEGIES[name]
    world = strategy.shard_ranks(dims)
    bf16_masters = steps_bf16_masters(precision)  # no fp32 copy; bf16 state
    model_bytes, master_weights = weight_bytes(str(precision.dtype), bool(precision.master_weights), bf16_masters)
    states = optimizer_state_of(optimizer, gpt, bf16_weights=bf16_masters).per_param
    hpz = zero.zero_hpz_partition_size
    extra = {"hpz_partition_size": hpz, "param_bytes": _DTYPE_BYTES[precision.dtype]} \
        if name == "fsdp2" and zero.stage == 3 and hpz > 1 else {}
    # experts: outside the wrapper, whole on their rank; FSDP2 keeps them (like all its parameters) in fp32
    expert_bytes, expert_masters = (weight_bytes(str(precision.dtype), False, bf16_masters)[0], False) \
        if name == "fsdp2" else (model_bytes, master_weights)
    # zero1_boundary partitions the experts' optimizer states over their expert-data-parallel group
    expert_strategy, expert_world = (strategy, dims.world_size // dims.ep) if name == "zero1_boundary" \
        else (DataParallelStrategy, 1)
    placement = ParameterPlacement.of(gpt, dims, cfg.parallel)
    ranks = []
    for pp_rank, tp_rank in placement.model_parallel_ranks():
        dense, expert = placement.rank_elements(pp_rank, tp_rank)
        held = strategy.model_state_bytes(dense, world, model_bytes, states, master_weights, **extra)
        whole = expert_strategy.model_state_bytes(expert, expert_world, expert_bytes, states, expert_masters)
        ranks.append(RankStates(pp_rank, tp_rank, dense, expert, held.parameters + whole.parameters,
                                held.gradients + whole.gradients, held.optimizer_states + whole.optimizer_states))
    return LayoutEstimate(dims, zero.stage, name, world, tuple(ranks))
