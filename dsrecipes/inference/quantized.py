"""Weight-only quantized linears for inference: int8 (dsrecipes.kernels) and packed int4 (torch).

    report = quantize_linears(model, QuantConfig(bits=8))   # every block linear -> WeightOnlyInt8Linear
    report.saved_bytes, report.before_bytes, report.after_bytes

Why weight-only: decoding at small batch is bound by reading the weights, so storing them in 8 (or 4)
bits cuts the bytes per token by 2x (4x) against bf16 while activations stay in floating point.

int8: `dsrecipes.kernels.quantization.quantize_int8` (symmetric, per output channel or per group)
and `int8_weight_only_matmul`, which dequantizes inside the Triton matmul on a GPU (or on CPU under
TRITON_INTERPRET=1, fp32); elsewhere the kernel library's reference runs (dequantize, then matmul).
int4: symmetric per-group (q in [-8, 7], scale = max|w| / 7), two values packed per byte; the kernel
library has no int4 matmul, so the weight is unpacked and dequantized in torch for each call (memory
saving only, no speed-up).

What is quantized: the linears inside the transformer blocks (attention and MLP projections). The
token embedding / LM head stays in floating point (it is tied to the embedding by default, so a
quantized copy would add bytes, not save them), as DeepSpeed and most weight-only schemes do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

QUANT_BITS = (8, 4)


@dataclass
class QuantConfig:
    enabled: bool = False
    bits: int = 8  # 8 (int8 kernels) | 4 (packed int4, torch dequantization)
    group_size: int = 0  # 0 = one scale per output channel (int8 only); else elements per group along K

    def validate(self, prefix: str = "quant") -> None:
        if self.bits not in QUANT_BITS:
            raise ValueError(f"{prefix}.bits={self.bits} is not valid; choose one of: 8, 4")
        if self.group_size < 0:
            raise ValueError(f"{prefix}.group_size={self.group_size} must be >= 0 (0 = per output channel)")
        if self.bits == 4 and self.group_size == 0:
            raise ValueError(f"{prefix}.group_size=0 (per channel) is not supported with {prefix}.bits=4; "
                             "use a group size such as 32, 64 or 128")


class WeightOnlyInt8Linear(nn.Module):
    """y = x @ dequant(q).T + b with q int8 [N, K] and fp32 scales [N, K / group]."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 0) -> WeightOnlyInt8Linear:
        from dsrecipes.kernels.quantization import quantize_int8_reference

        w = linear.weight.detach().float()
        granularity = "group" if group_size else "channel"
        q, scale, _ = quantize_int8_reference(w, "symmetric", granularity, group_size or 128)
        bias = linear.bias.detach() if linear.bias is not None else None
        return cls(q, scale, bias)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        from dsrecipes.kernels.int8_matmul import int8_weight_only_matmul

        return int8_weight_only_matmul(x, self.q, self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from dsrecipes.kernels.int8_matmul import int8_weight_only_matmul

        return int8_weight_only_matmul(x, self.q, self.scale, bias=self.bias)

    def dequantized_weight(self) -> torch.Tensor:
        from dsrecipes.kernels.quantization import dequantize_int8_reference

        return dequantize_int8_reference(self.q, self.scale)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8, groups/row={self.scale.shape[-1]}"


def pack_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-group int4 of w [N, K] (K even, divisible by group_size): (packed uint8 [N, K/2], scale fp32 [N, K/g])."""
    n, k = w.shape
    wg = w.float().reshape(n, k // group_size, group_size)
    scale = wg.abs().amax(-1) / 7.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(wg / scale[..., None]).clamp_(-8, 7).to(torch.int16).reshape(n, k) + 8  # 0..15
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
    return packed, scale


def unpack_int4(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Dequantized weight [N, K] in `dtype` from `pack_int4`'s output."""
    n = packed.shape[0]
    p = packed.to(torch.int16)
    q = torch.stack((p & 0xF, p >> 4), dim=-1).reshape(n, -1) - 8
    groups = scale.shape[-1]
    w = q.reshape(n, groups, -1).float() * scale[..., None]
    return w.reshape(n, -1).to(dtype)


class WeightOnlyInt4Linear(nn.Module):
    """y = x @ dequant(packed).T + b; two int4 values per byte, fp32 scale per group."""

    def __init__(self, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = packed.shape[1] * 2, packed.shape[0]
        self.register_buffer("packed", packed)
        self.register_buffer("scale", scale)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int) -> WeightOnlyInt4Linear:
        packed, scale = pack_int4(linear.weight.detach(), group_size)
        return cls(packed, scale, linear.bias.detach() if linear.bias is not None else None)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return unpack_int4(self.packed, self.scale, dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight(x.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4, groups/row={self.scale.shape[-1]}"


@dataclass
class QuantReport:
    bits: int
    layers: int
    before_bytes: int  # bytes of the replaced weights as they were (their dtype)
    after_bytes: int  # bytes of the quantized weights and their scales
    model_before_bytes: int
    model_after_bytes: int

    @property
    def saved_bytes(self) -> int:
        return self.before_bytes - self.after_bytes

    def describe(self) -> str:
        mib = 2**20
        return (f"int{self.bits} weight-only: {self.layers} linears, {self.before_bytes / mib:.2f} MiB -> "
                f"{self.after_bytes / mib:.2f} MiB (saved {self.saved_bytes / mib:.2f} MiB); whole model "
                f"{self.model_before_bytes / mib:.2f} -> {self.model_after_bytes / mib:.2f} MiB "
                f"({self.model_before_bytes / max(self.model_after_bytes, 1):.2f}x smaller)")


def module_bytes(model: nn.Module) -> int:
    """Bytes of the parameters and buffers (each storage counted once: tied weights once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def _block_linears(model: nn.Module):
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise ValueError("quant: the model has no `blocks` (a dsrecipes GPT is expected)")
    for block in blocks:
        for parent in block.modules():
            for name, child in parent.named_children():
                if type(child) is nn.Linear:
                    yield parent, name, child


def quantize_linears(model: nn.Module, cfg: QuantConfig) -> QuantReport:
    """Replace the block linears of `model` in place by weight-only quantized ones; returns the saving."""
    cfg.validate()
    model_before = module_bytes(model)
    before = after = layers = 0
    for parent, name, linear in list(_block_linears(model)):
        k = linear.in_features
        if cfg.group_size and k % cfg.group_size:
            raise ValueError(f"quant.group_size={cfg.group_size} does not divide the input size {k} of {name}")
        if cfg.bits == 8:
            new = WeightOnlyInt8Linear.from_linear(linear, cfg.group_size)
            after += new.q.numel() + new.scale.numel() * 4
        else:
            if k % 2:
                raise ValueError(f"quant.bits=4 needs an even input size, {name} has {k}")
            new = WeightOnlyInt4Linear.from_linear(linear, cfg.group_size)
            after += new.packed.numel() + new.scale.numel() * 4
        before += linear.weight.numel() * linear.weight.element_size()
        setattr(parent, name, new.to(linear.weight.device))
        layers += 1
    return QuantReport(cfg.bits, layers, before, after, model_before, module_bytes(model))
