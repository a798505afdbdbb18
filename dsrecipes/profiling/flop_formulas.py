"""FLOP formulas torch.utils.flop_counter lacks, given to FlopCounterMode through its `custom_mapping`.

FlopCounterMode counts matrix products (mm, addmm, bmm, baddbmm, convolutions) and the CUDA
scaled-dot-product-attention kernels (flash, memory-efficient, cuDNN), forward and backward. The
CPU build of SDPA dispatches to aten._scaled_dot_product_flash_attention_for_cpu, which its registry
does not list, so on a CPU run attention would count 0 FLOPs. These entries count it with torch's
own formulas (sdpa_flop_count / sdpa_backward_flop_count: the full T x T score matrix, causal or not,
as torch counts the CUDA kernels). Everything else (elementwise ops, norms, softmax) is not counted,
by torch's design: a FLOP here is a multiply or add of a matrix product, FLOPs = 2 x MACs.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten


def _cpu_flash_attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_flash_attention_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                                  **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


EXTRA_FLOP_FORMULAS: dict = {}
for _name, _formula in (("_scaled_dot_product_flash_attention_for_cpu", _cpu_flash_attention),
                        ("_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_flash_attention_backward)):
    if hasattr(aten, _name):  # present in every torch dsrecipes supports; guarded for other builds
        EXTRA_FLOP_FORMULAS[getattr(aten, _name)] = _formula


@functools.cache
def warm_up_flop_counter() -> None:
    """Run one tiny op under a counter: the first dispatch through a TorchDispatchMode in a process pays
    one-off imports and set-up (seconds), which would otherwise be charged to the first profiled module."""
    with flop_counter():
        torch.ones(2, 2) @ torch.ones(2, 2)


def flop_counter(**kwargs) -> torch.utils.flop_counter.FlopCounterMode:
    """A FlopCounterMode (display off) that also counts CPU attention; the one every dsrecipes profile uses."""
    from torch.utils.flop_counter import FlopCounterMode

    kwargs.setdefault("display", False)
    return FlopCounterMode(custom_mapping=dict(EXTRA_FLOP_FORMULAS), **kwargs)
