"""fp32 -> bf16 by stochastic rounding, with noise that depends on an element's place in the whole tensor only.

What: `round_to_bf16(x, whole_index, salt)` rounds each fp32 value to one of its two bf16 neighbours, up with the
probability of its distance from the lower one, so the rounding is unbiased on average (a moment updated by tiny
increments keeps them instead of losing each one to round-to-nearest). The 16 bits of noise per element are a hash
of (the element's flat index in the *whole* tensor, salt): `global_flat_index(t)` gives that index for a DTensor's
local shard too.

Why a counter-based hash and not torch's generator: the draws must not depend on how a tensor is sharded (ZeRO-3 at
world 2 must round as world 1 does) nor on any generator state (a resumed run must round as the straight run did, so
the checkpoint holds no RNG state for it). The salt carries the step and which state tensor it is.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

# multipliers below 2^31, so a 32-bit value times one stays inside int64 (no overflow in torch's integer ops)
_MIX = (0x7FEB352D, 0x6A09E667, 0x5BD1E995)
_LOW_32 = 0xFFFFFFFF


def global_flat_index(tensor: torch.Tensor) -> torch.Tensor:
    """int64 tensor of the local data's shape: each element's row-major index in the whole (global) tensor."""
    if not isinstance(tensor, DTensor):
        return torch.arange(tensor.numel(), device=tensor.device).view(tensor.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = tensor.to_local()
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    index = torch.zeros(local.shape, dtype=torch.int64, device=local.device)
    stride = 1
    for dim in reversed(range(len(shape))):
        positions = torch.arange(shape[dim], dtype=torch.int64, device=local.device) + offset[dim]
        view = [1] * len(shape)
        view[dim] = shape[dim]
        index += positions.view(view) * stride
        stride *= tensor.shape[dim]
    return index


def noise_bits(index: torch.Tensor, salt: int) -> torch.Tensor:
    """16 pseudo-random bits (int32 in [0, 65536)) per element of `index`, a hash of (index, salt)."""
    x = (index + (salt & _LOW_32) * 0x9E3779B1) & _LOW_32
    for multiplier in _MIX:
        x = (x ^ (x >> 16)) * multiplier & _LOW_32
    return ((x ^ (x >> 15)) & 0xFFFF).to(torch.int32)


def round_to_bf16(values: torch.Tensor, index: torch.Tensor, salt: int) -> torch.Tensor:
    """`values` (fp32, a plain tensor) rounded stochastically to bf16; inf and NaN pass through as they are."""
    bits = values.contiguous().view(torch.int32)
    rounded = ((bits + noise_bits(index, salt)) & -65536).view(torch.float32)
    return torch.where(torch.isfinite(values), rounded, values).to(torch.bfloat16)
