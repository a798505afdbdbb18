"""ZeRO stage 1 without a module wrapper: for pipelines (a schedule runs the stages) and expert parallelism.

Gradients are averaged at the accumulation boundary as in the `allreduce` strategy (one flat
all-reduce over the data-parallel group; expert gradients over their expert-data-parallel group).
The optimizer state is partitioned: every parameter has one owner among the ranks that hold the
same parameter (greedy by size, the same assignment on every rank), each rank's optimizer keeps
and steps only the parameters it owns, and after the step each owner broadcasts its updated
tensors to its peers (one flat bucket per owner and dtype). Experts are partitioned over the
expert-data-parallel group, the other parameters over the data-parallel group, so no shard mixes
different ranks' experts.

fp32 master weights (precision.master_weights) stay beside the module, whole on every rank (the
optimizer states, 2x the masters with Adam, are what is partitioned; DeepSpeed's stage 1 partitions
the masters too). Checkpoints are DCP: an optimizer over the owned parameters only writes disjoint
keys on the data-parallel peers, so the union is the whole optimizer and any layout reads it back
(a pp x dp ZeRO-1 checkpoint resumes in one process).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dsrecipes.distributed.data_parallel.allreduce import BoundaryAllReduceStrategy
from dsrecipes.distributed.data_parallel.base import ModelStateBytes
from dsrecipes.distributed.expert_parallel import is_expert_param
from dsrecipes.utils.dtensors import local as local_piece


def assign_owners(params: list[torch.Tensor], ranks: int) -> list[int]:
    """Owner (group rank) of each parameter: the largest first, each to the least-loaded rank (ties: lowest rank)."""
    load = [0] * ranks
    owners = [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: (-local_piece(params[i]).numel(), i)):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owners[i] = rank
        load[rank] += local_piece(params[i]).numel()
    return owners


class BoundaryZeroStage1Strategy(BoundaryAllReduceStrategy):
    name = "zero1_boundary"
    description = ("ZeRO-1 without a wrapper: gradients all-reduced at the boundary, optimizer state partitioned "
                   "over the data-parallel ranks, updated parameters broadcast by their owners")

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Keep, in each param group, only the parameters this rank owns (in place, before any step)."""
        self.all_params = [p for group in optimizer.param_groups for p in group["params"]]
        ep = self.layout.expert_parallel
        plain = [p for p in self.all_params if not is_expert_param(p)]
        experts = [p for p in self.all_params if is_expert_param(p)]
        self.partitions = []  # (group, [(owner group rank, global rank, params)])
        owned: set[int] = set()
        for params, group in ((plain, self.group), (experts, ep.edp_group if ep is not None else None)):
            if not params:
                continue
            size, me = dist.get_world_size(group), dist.get_rank(group)
            owners = assign_owners(params, size)
            buckets = []
            for r in range(size):
                mine = [p for p, o in zip(params, owners) if o == r]
                if mine:
                    buckets.append((dist.get_global_rank(group, r) if group is not None else r, mine))
            self.partitions.append((group, size, buckets))
            owned.update(id(p) for p, o in zip(params, owners) if o == me)
        for group in optimizer.param_groups:
            group["params"] = [p for p in group["params"] if id(p) in owned]
        self.owned_numel = sum(local_piece(p).numel() for p in self.all_params if id(p) in owned)
        self.optimizer = optimizer
        return optimizer

    def _params_with_grads(self) -> list[torch.Tensor]:
        return [p for p in self.all_params if p.grad is not None]  # every parameter, owned or not

    @torch.no_grad()
    def after_step(self) -> None:
        """Every owner's updated parameters (the fp32 masters where kept) to its peers, then masters -> model."""
        for group, size, buckets in self.partitions:
            if size == 1:
                continue
            for src, params in buckets:
                by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
                for p in params:
                    by_dtype.setdefault(p.dtype, []).append(local_piece(p))
                for tensors in by_dtype.values():
                    flat = torch.cat([t.reshape(-1) for t in tensors])
                    dist.broadcast(flat, src=src, group=group)
                    if dist.get_rank() != src:
                        torch._foreach_copy_(tensors, [c.view_as(t) for c, t in
                                                       zip(flat.split([t.numel() for t in tensors]), tensors)])
        super().after_step()

    def zero_grad(self) -> None:
        for p in self.all_params:
            p.grad = None
        self.module.zero_grad(set_to_none=True)

    def describe(self) -> str:
        if not hasattr(self, "all_params"):
            return self.description
        total = sum(local_piece(p).numel() for p in self.all_params)
        extra = ", fp32 master weights beside the bf16/fp16 model" if self.masters is not None else ""
        return (f"ZeRO-1 (no wrapper): optimizer state of {self.owned_numel} of {total} parameters on this rank, "
                f"gradients all-reduced at the boundary{extra}")

    @classmethod
    def shard_ranks(cls, dims) -> int:
        return dims.dp_sp  # the data-parallel group the non-expert parameters are partitioned over

    @classmethod
    def model_state_bytes(cls, num_params, world, model_bytes, state_bytes, master_weights) -> ModelStateBytes:
        masters = 4 * num_params if master_weights else 0  # whole on every rank (see the module docstring)
        grads = 4 * num_params if master_weights else model_bytes * num_params
        return ModelStateBytes(model_bytes * num_params + masters, grads, state_bytes * num_params / world)
