"""Which parameters each rank of a parallel layout holds (tp, pp and ep), from the model built on the meta device.

    placement = ParameterPlacement.of(gpt_on_meta, dims, cfg.parallel)
    for pp_rank, tp_rank in placement.model_parallel_ranks():  # the coordinates that decide what a rank holds
        dense, expert = placement.rank_elements(pp_rank, tp_rank)

The layout's own rules, applied parameter by parameter, in parallelize's order (dsrecipes.profiling.layout_memory
turns the counts into bytes):

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
   them (Experts.keep_local).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from dsrecipes.distributed.parallel_dims import ParallelDims
from dsrecipes.distributed.pipeline_parallel import partition_blocks, stages_per_rank
from dsrecipes.models.moe import MoELayer


def shard_size(n: int, parts: int, index: int) -> int:
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
class ParameterPlacement:
    """Where a layout puts the model's parameters, worked out once: ask it what any rank holds."""

    gpt: nn.Module  # on the meta device, unsharded
    dims: ParallelDims
    stages_per_rank: int
    ranges: list[range]  # the pipeline's block range of every stage
    shard_dims: dict[str, int]  # parameter name -> the dimension tensor parallelism shards
    experts: set[str]

    @classmethod
    def of(cls, gpt: nn.Module, dims: ParallelDims, par) -> ParameterPlacement:
        """par: the recipe's parallel group (pp_schedule, pp_partition, tp_sequence_parallel)."""
        per_rank = stages_per_rank(par.pp_schedule) if dims.pp > 1 else 1
        ranges = partition_blocks(gpt, dims.pp * per_rank, par.pp_partition)
        shard_dims = _tp_shard_dims(gpt, par.tp_sequence_parallel) if dims.tp > 1 else {}
        return cls(gpt, dims, per_rank, ranges, shard_dims, _expert_names(gpt))

    def model_parallel_ranks(self) -> list[tuple[int, int]]:
        """Every (pp_rank, tp_rank): every other rank holds as many parameter elements as the one at its coordinates
        (data- and sequence-parallel peers the same ones, expert-parallel peers other experts of the same size; see
        ParallelDims.model_parallel_coordinates for a global rank's)."""
        return [(pp_rank, tp_rank) for pp_rank in range(self.dims.pp) for tp_rank in range(self.dims.tp)]

    def rank_elements(self, pp_rank: int, tp_rank: int) -> tuple[int, int]:
        """(dense, expert) parameter elements on the rank at (pp_rank, tp_rank): dense ones data parallelism then
        replicates or shards, expert ones held whole on the rank."""
        gpt, dims = self.gpt, self.dims
        # interleaved schedules: rank r runs stages r, r + pp, ... (the pipeline's looped layout)
        stage_ids = [pp_rank + k * dims.pp for k in range(self.stages_per_rank)]
        blocks = {i for s in stage_ids for i in self.ranges[s]}
        has_first, has_last = 0 in stage_ids, len(self.ranges) - 1 in stage_ids
        dense = expert = 0
        seen: set[int] = set()  # a tied weight held twice by one rank (its two names) counts once
        for name, param in gpt.named_parameters(remove_duplicate=False):
            part, index = _stage_owner(name)
            held = index in blocks if part == "block" else has_first if part == "first" else has_last
            if not held or id(param) in seen:
                continue
            seen.add(id(param))
            shape = list(param.shape)
            if name in self.shard_dims:
                dim = self.shard_dims[name]
                shape[dim] = shard_size(shape[dim], dims.tp, tp_rank)
            numel = 1
            for size in shape:
                numel *= size
            if name in self.experts:
                expert += numel // dims.ep  # E / ep experts per rank (the number of experts divides by ep)
            else:
                dense += numel
        return dense, expert
