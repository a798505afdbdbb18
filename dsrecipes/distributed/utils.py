"""Small torch.distributed helpers that are no-ops in a single process."""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank if `flag` is true on any rank (all-reduce MAX), so ranks act together."""
    if not is_distributed():
        return flag
    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())
