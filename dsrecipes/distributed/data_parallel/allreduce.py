"""Data parallelism without a module wrapper: gradients averaged in one flat all-reduce at the boundary.

For models that DDP cannot wrap: the stages of a pipeline (torch.distributed.pipelining drives each
stage's forward and backward itself, not a forward call), and tensor-parallel models whose gradients
must still be averaged over sequence-parallel peers (DDP takes no DTensor parameters; their local
shards are all-reduced here). Each rank's gradients are averaged over its data- and sequence-parallel
peers (dp x sp) once per optimizer step, as DeepSpeed's engine does for ZeRO-0 (`allreduce_gradients`
at the accumulation boundary).

fp32 master weights (precision.master_weights) live beside the local stage module; checkpoints are
sharded (DCP) over the masters' tree, so every stage writes its own fp32 weights and optimizer state
under the model's names (full-state files would hold one rank's optimizer and the stages' 16-bit
weights), and any layout reads back what it holds.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dsrecipes.distributed.data_parallel.base import DataParallelStrategy
from dsrecipes.distributed.expert_parallel import is_expert_param
from dsrecipes.utils.dtensors import local as local_piece


class BoundaryAllReduceStrategy(DataParallelStrategy):
    name = "allreduce"
    description = "gradients averaged over the data-parallel ranks in one all-reduce per step (no module wrapper)"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.group = self.dims.get_mesh("dp_sp").get_group()

    @property
    def uses_full_state_checkpoints(self) -> bool:
        return False  # DCP, master weights included (state_module is their tree)

    @property
    def state_module(self) -> nn.Module:
        return self.masters.view() if self.masters is not None else self.module

    def after_load(self) -> None:
        if self.masters is not None:
            self.masters.master_to_model()

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        super().reduce_gradients()  # (fp32 masters, experts over their own group)
        grads = [local_piece(p.grad) for p in self._params_with_grads() if not is_expert_param(p)]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        flat.div_(dist.get_world_size(self.group))
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
