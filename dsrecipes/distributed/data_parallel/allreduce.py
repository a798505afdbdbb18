"""Data parallelism without a module wrapper: gradients averaged in one flat all-reduce at the boundary.

For models that DDP cannot wrap: the stages of a pipeline (torch.distributed.pipelining drives each
stage's forward and backward itself, not a forward call), and tensor-parallel models whose gradients
must still be averaged over sequence-parallel peers (DDP takes no DTensor parameters; their local
shards are all-reduced here). Each rank's gradients are averaged over its data- and sequence-parallel
peers (dp x sp) once per optimizer step, as DeepSpeed's engine does for ZeRO-0 (`allreduce_gradients`
at the accumulation boundary).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from dsrecipes.distributed.data_parallel.base import DataParallelStrategy
from dsrecipes.distributed.expert_parallel import is_expert_param


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class BoundaryAllReduceStrategy(DataParallelStrategy):
    name = "allreduce"
    description = "gradients averaged over the data-parallel ranks in one all-reduce per step (no module wrapper)"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.group = self.dims.get_mesh("dp_sp").get_group()

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        super().reduce_gradients()  # (fp32 masters, experts over their own group)
        grads = [_local(p.grad) for p in self._params_with_grads() if not is_expert_param(p)]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        flat.div_(dist.get_world_size(self.group))
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
