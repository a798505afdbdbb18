"""Per-rank model states of a parallel layout (tp, pp, sp, ep next to data parallelism), from parameter shapes.

    layout = estimate_layout(gpt_on_meta, cfg, dims)   # dims: ParallelDims.from_config(cfg, world_size)
    layout.heaviest                                      # the rank holding the most: its bytes and counts
    layout.for_rank(global_rank)                         # any rank's figures (the tests measure every rank)

What a rank holds is worked out parameter by parameter on the model built on the meta device, by the
rules the run itself applies, in parallelize's order:

1. tensor parallelism: the plans of dsrecipes.distributed.tensor_parallel (`block_plan`, `model_plan`)
   name the column- and row-parallel modules; a column-parallel Linear is sharded on its output rows
   (weight and bias), a row-parallel one on its input columns (its bias replicated); the embedding
   (row-parallel: vocabulary rows) and the LM head (column-parallel) share one vocab-sharded tensor
   when tied. Norms and position embeddings stay whole. Uneven shards are sized as DTensor's Shard
   sizes them (ceil(n / tp) rows per rank, the last ranks holding the rest), so tp rank 0 is the largest.
2. pipeline parallelism: `partition_blocks` and `stages_per_rank` of dsrecipes.distributed.pipeline_parallel
   (the very functions the pipeline calls) say which blocks each pipeline rank keeps; the first stage
   also holds the embeddings, the last the final norm and the LM head, and a tied embedding is held by
   both (the pipeline keeps a copy on the last stage).
3. expert parallelism: the `experts` tensors of every MoE layer are [E, ...]; each rank keeps E / ep of
   them (Experts.keep_local). They are kept out of DDP and FSDP2 (ignored parameters), so they are held
   whole on their rank (replicated over the edp peers): parameters, gradients and optimizer states
   (zero1_boundary partitions their optimizer states over the edp peers). FSDP2 leaves them in fp32.
4. data parallelism: the strategy the engine's choice table picks for this config and layout
   (`choose_strategy`) shards the rest: `model_state_bytes` over `shard_ranks(dims)` ranks (dp for
   ZeRO-1/2 and zero1_boundary, dp_shard x sp for FSDP2, 1 for DDP, the pipeline's all-reduce or a single
   data-parallel rank).

Not modelled: activations (not model states), FSDP2's padding of uneven shards (< 1 row per tensor),
its transient unsharded parameters, communication buckets, and CPU offload's placement (offloaded
states are counted here as held, wherever they live).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from dsrecipes.distributed.data_parallel import STRATEGIES, DataParallelStrategy, choose_strategy
from dsrecipes.distributed.parallel_dims import ParallelDims
from dsrecipes.distributed.pipeline_parallel import partition_blocks, stages_per_rank
from dsrecipes.models.moe import MoELayer
from dsrecipes.profiling.memory_estimator import _DTYPE_BYTES, optimizer_state_bytes


def describe_layout(dims: ParallelDims) -> str:
    """world 8 = pp 2 x dp 2 x sp 1 x tp 2, ep 1"""
    return f"world {dims.world_size} = pp {dims.pp} x dp {dims.dp} x sp {dims.sp} x tp {dims.tp}, ep {dims.ep}"


def is_plain_data_parallel(dims: ParallelDims) -> bool:
    """No tensor, pipeline, sequence or expert parallelism: the plain per-stage estimate applies."""
    return dims.tp == dims.pp == dims.sp == dims.ep == 1


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
        dims = self.dims
        pp_rank, tp_rank = rank // (dims.world_size // dims.pp), rank % dims.tp
        return next(r for r in self.ranks if (r.pp_rank, r.tp_rank) == (pp_rank, tp_rank))

    def title(self) -> str:
        return describe_layout(self.dims)


# ---------------------------------------------------------------------------------------------------
# Where each parameter lives
# ---------------------------------------------------------------------------------------------------


def _shard_size(n: int, parts: int, index: int) -> int:
    """Rows of a dimension of n that rank `index` of `parts` holds under DTensor's Shard (ceil-sized chunks)."""
    chunk = -(-n // parts)
    return max(0, min(n, (index + 1) * chunk) - index * chunk)


def _tp_shard_dims(gpt: nn.Module, sequence_parallel: bool) -> dict[str, int]:
    """{parameter name: the dimension tensor parallelism shards} from the plans the run applies."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from dsrecipes.distributed.tensor_parallel import block_plan, model_plan

    plans = {name: style for name, style in model_plan(gpt, sequence_parallel).items()}
    for index, block in enumerate(gpt.blocks):
        plans.update({f"blocks.{index}.{name}": style for name, style in block_plan(block, sequence_parallel).items()})
    dims: dict[str, int] = {}
    modules = dict(gpt.named_modules())
    for name, style in plans.items():
        module = modules[name]
        embedding = isinstance(module, nn.Embedding)
        if isinstance(style, ColwiseParallel):  # Linear: output rows (weight and bias); Embedding: columns
            dims.update({f"{name}.weight": 1 if embedding else 0, f"{name}.bias": 0})
        elif isinstance(style, RowwiseParallel):  # Linear: input columns (bias replicated); Embedding: rows
            dims[f"{name}.weight"] = 0 if embedding else 1
    from dsrecipes.models.moe import Experts

    for name, module in modules.items():  # expert-tensor parallelism: every expert's hidden width over tp
        if isinstance(module, Experts):
            dims.update({f"{name}.{p}": module.hidden_dim(p) for p in module.weight_names()
                         if module.hidden_dim(p) is not None})
    return dims


def _expert_names(gpt: nn.Module) -> set[str]:
    """Names of the expert tensors (ExpertParallel's rule: the parameters of every MoE layer's experts)."""
    return {f"{layer_name}.experts.{name}" for layer_name, layer in gpt.named_modules() if isinstance(layer, MoELayer)
            for name, _ in layer.experts.named_parameters()}


def _stage_owner(name: str) -> tuple[str, int | None]:
    """Which part of a pipeline holds a parameter: ("block", i), ("first", None) or ("last", None)."""
    head = name.split(".", 1)[0]
    if head == "blocks":
        return "block", int(name.split(".")[1])
    if head in ("tok_emb", "pos_emb"):
        return "first", None
    return "last", None  # final_norm, lm_head


@dataclass(frozen=True)
class _Placement:
    """What decides where the model's parameters go, worked out once per estimate."""

    stages_per_rank: int
    ranges: list[range]  # the pipeline's block range of every stage
    shard_dims: dict[str, int]  # parameter name -> the dimension tensor parallelism shards
    experts: set[str]

    @classmethod
    def of(cls, gpt: nn.Module, dims: ParallelDims, par) -> _Placement:
        per_rank = stages_per_rank(par.pp_schedule) if dims.pp > 1 else 1
        ranges = partition_blocks(gpt, dims.pp * per_rank, par.pp_partition)
        shard_dims = _tp_shard_dims(gpt, par.tp_sequence_parallel) if dims.tp > 1 else {}
        return cls(per_rank, ranges, shard_dims, _expert_names(gpt))


def _rank_elements(gpt: nn.Module, dims: ParallelDims, placement: _Placement, pp_rank: int,
                   tp_rank: int) -> tuple[int, int]:
    """(dense, expert) parameter elements on the rank at (pp_rank, tp_rank)."""
    # interleaved schedules: rank r runs stages r, r + pp, ... (the pipeline's looped layout)
    stage_ids = [pp_rank + k * dims.pp for k in range(placement.stages_per_rank)]
    blocks = {i for s in stage_ids for i in placement.ranges[s]}
    has_first, has_last = 0 in stage_ids, len(placement.ranges) - 1 in stage_ids
    dense = expert = 0
    seen: set[int] = set()  # a tied weight held twice by one rank (its two names) counts once
    for name, param in gpt.named_parameters(remove_duplicate=False):
        part, index = _stage_owner(name)
        held = index in blocks if part == "block" else has_first if part == "first" else has_last
        if not held or id(param) in seen:
            continue
        seen.add(id(param))
        shape = list(param.shape)
        if name in placement.shard_dims:
            dim = placement.shard_dims[name]
            shape[dim] = _shard_size(shape[dim], dims.tp, tp_rank)
        numel = 1
        for size in shape:
            numel *= size
        if name in placement.experts:
            expert += numel // dims.ep  # E / ep experts per rank (the number of experts divides by ep)
        else:
            dense += numel
    return dense, expert


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
    master_weights = bool(precision.master_weights)
    model_bytes = _DTYPE_BYTES[precision.dtype] if master_weights else 4
    states = optimizer_state_bytes(optimizer.name, getattr(optimizer, "momentum", 0.0))
    hpz = zero.zero_hpz_partition_size
    extra = {"hpz_partition_size": hpz, "param_bytes": _DTYPE_BYTES[precision.dtype]} \
        if name == "fsdp2" and zero.stage == 3 and hpz > 1 else {}
    # experts: outside the wrapper, whole on their rank; FSDP2 keeps them (like all its parameters) in fp32
    expert_bytes, expert_masters = (4, False) if name == "fsdp2" else (model_bytes, master_weights)
    # zero1_boundary partitions the experts' optimizer states over their expert-data-parallel group
    expert_strategy, expert_world = (strategy, dims.world_size // dims.ep) if name == "zero1_boundary" \
        else (DataParallelStrategy, 1)
    placement = _Placement.of(gpt, dims, cfg.parallel)
    ranks = []
    for pp_rank in range(dims.pp):
        for tp_rank in range(dims.tp):
            dense, expert = _rank_elements(gpt, dims, placement, pp_rank, tp_rank)
            held = strategy.model_state_bytes(dense, world, model_bytes, states, master_weights, **extra)
            whole = expert_strategy.model_state_bytes(expert, expert_world, expert_bytes, states, expert_masters)
            ranks.append(RankStates(pp_rank, tp_rank, dense, expert, held.parameters + whole.parameters,
                                    held.gradients + whole.gradients, held.optimizer_states + whole.optimizer_states))
    return LayoutEstimate(dims, zero.stage, name, world, tuple(ranks))
