"""Whole tensors for compression decisions, and masks applied to a tensor's shard.

Masks and quantization scales are computed from whole weights, so a sharded run (FSDP2 / ZeRO-3
shards, tensor-parallel DTensors) decides exactly what one process decides: `whole(t)` gathers a
DTensor (`full_tensor()`, a collective every rank of its mesh calls at the same point) and returns a
plain tensor unchanged. `mask_(t, mask)` multiplies a whole-tensor 0/1 mask (broadcastable to t's
global shape) into t in place, into only this rank's piece when t is a DTensor (the mask is split
locally by t's placements: no communication).

`local(t)` is this rank's piece (a DTensor's local shard, a plain tensor as it is), for collectives and
sizes that work on what a rank holds.

Public: `whole`, `local`, `mask_`, `like`.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

__all__ = ["whole", "local", "mask_", "like"]


def whole(t: torch.Tensor) -> torch.Tensor:
    """`t` itself, or the gathered global value of a DTensor (detached; a collective over its mesh)."""
    if isinstance(t, DTensor):
        return t.detach().full_tensor()
    return t


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's piece of `t`: a DTensor's local shard (no communication), a plain tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def like(full: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """`full` (a whole tensor of ref's global shape) laid out as `ref`: a DTensor with ref's mesh and
    placements (each rank keeping its own piece, split locally), or `full` itself when ref is plain."""
    if isinstance(ref, DTensor):
        return distribute_tensor(full, ref.device_mesh, ref.placements, src_data_rank=None)
    return full


@torch.no_grad()
def mask_(t: torch.Tensor, mask: torch.Tensor) -> None:
    """t *= mask in place, mask being 0/1 over t's whole (global) shape or broadcastable to it."""
    full = mask.to(device=t.device, dtype=t.dtype).expand(t.shape)
    if isinstance(t, DTensor):
        t.to_local().mul_(like(full.contiguous(), t).to_local())
    else:
        t.mul_(full)
