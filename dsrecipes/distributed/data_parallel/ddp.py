"""ZeRO stage 0: torch's DistributedDataParallel, gradients all-reduced at the accumulation boundary.

With precision.master_weights the fp32 master weights are attached *before* DDP wraps the model, so
DDP's reducer hooks sit on the bf16/fp16 parameters that receive the gradients (attached after,
the hooks stayed on the fp32 originals and gradients were never averaged). Every rank first takes
rank 0's fp32 weights (DDP's own broadcast would only reach the low-precision copies), and the
low-precision gradient buckets are averaged in fp32 by a communication hook, as DeepSpeed's
fp16/bf16 optimizers reduce in fp32.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dsrecipes.distributed.data_parallel.base import DataParallelStrategy
from dsrecipes.utils.modules import broadcast_module


def fp32_allreduce_hook(group, bucket):
    """DDP communication hook (group: a ProcessGroup, bucket: a dist.GradBucket; DDP checks real
    annotations, which this module's postponed ones are not): average a low-precision gradient
    bucket in fp32, then store it back; returns the Future DDP waits on."""
    buffer = bucket.buffer()
    wide = buffer.float().div_(dist.get_world_size(group))
    future = dist.all_reduce(wide, group=group, async_op=True).get_future()

    def store(fut):
        buffer.copy_(fut.value()[0])
        return buffer

    return future.then(store)


class DDPStrategy(DataParallelStrategy):
    name = "ddp"
    description = "DDP: model state replicated, gradients all-reduced at the accumulation boundary"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mesh = self.dims.get_mesh("dp_sp")
        self.group = self.mesh.get_group()

    def wrap(self, model: nn.Module, ignored_params: set[nn.Parameter] | None = None) -> nn.Module:
        if self.keeps_module_masters:  # the fp32 masters start equal on every rank (experts differ by design)
            broadcast_module(model, self.group, skip=ignored_params)
        # named before the masters are attached: the module then holds low-precision copies under the same names
        names = [name for name, p in model.named_parameters() if p in ignored_params] if ignored_params else []
        self._attach_masters(model)
        if names:  # expert-parallel experts differ per rank: reduced over their own group
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids, process_group=self.group)
        if self.masters is not None:
            wrapped.register_comm_hook(self.group, fp32_allreduce_hook)
        self.unwrapped, self.module = model, wrapped
        return wrapped

    def before_forward(self, boundary: bool) -> None:
        # gradients are all-reduced only at the accumulation boundary (ZeRO 0/1, as DeepSpeed)
        self.module.require_backward_grad_sync = boundary
