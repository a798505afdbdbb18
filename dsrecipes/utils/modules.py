"""Small nn.Module helpers shared by the data-parallel mechanisms.

* `cast_float_buffers`: a model's floating-point buffers to its low-precision dtype.
* `module_view`: a module tree with the model's names that holds other tensors in place of some
  parameters (fp32 master weights, a rank's shards), so torch's state-dict and DCP helpers see
  them under the model's own names.
* `broadcast_module`: every rank starts from one rank's weights and buffers (as DDP does).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def cast_float_buffers(module: nn.Module, dtype: torch.dtype) -> None:
    """Every floating-point buffer of `module` to `dtype` (integer buffers stay)."""
    for owner in module.modules():
        for name, buf in list(owner.named_buffers(recurse=False)):
            if buf is not None and buf.is_floating_point():
                setattr(owner, name, buf.to(dtype))


def module_view(module: nn.Module, replacements: dict[int, nn.Parameter]) -> nn.Module:
    """A tree of empty modules mirroring `module`'s names, holding replacements[id(p)] in place of each
    parameter p that has one (the others, and every buffer, as they are). Tied parameters stay tied."""
    mirrors: dict[str, nn.Module] = {}
    for name, sub in module.named_modules():
        mirror = nn.Module()
        mirrors[name] = mirror
        if name:
            parent, _, leaf = name.rpartition(".")
            mirrors[parent].add_module(leaf, mirror)
        for pname, p in sub._parameters.items():
            if p is not None:
                mirror.register_parameter(pname, replacements.get(id(p), p))
        for bname, buf in sub._buffers.items():
            if buf is not None:
                mirror.register_buffer(bname, buf, persistent=bname not in sub._non_persistent_buffers_set)
    return mirrors[""]


@torch.no_grad()
def broadcast_module(module: nn.Module, group=None, src_group_rank: int = 0, skip: set | None = None) -> None:
    """Copy one rank's parameters and buffers into every rank of `group` (default: the world), except the
    parameters in `skip` (those that differ per rank by design, e.g. expert-parallel experts)."""
    source = dist.get_global_rank(group, src_group_rank) if group is not None else src_group_rank
    for tensor in list(module.parameters()) + list(module.buffers()):
        if skip and tensor in skip:
            continue
        dist.broadcast(tensor.data, src=source, group=group)
