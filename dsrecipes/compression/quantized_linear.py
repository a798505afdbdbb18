"""QuantizedLinear: the inference layer a fake-quantized nn.Linear becomes after redundancy clean.

What it stores (all in its state dict, so safetensors holds them):
    qweight     integer codes of the weight [out, in]: int8 for 5..8 bits, two 4-bit codes per byte
                (uint8, (q + 8) in each nibble, low nibble first) for 2..4 bits, int16 for 9..16 bits
    scale       fp32 [groups]; zero_point int32 [groups] (asymmetric only)
    bias        as the float layer had it
    act_range   fp32 [2] static activation range (static activation quantization only)
Groups are DeepSpeed's `quantize_groups`: contiguous chunks of the flattened weight. The codes are
DeepSpeed's grid points (`dsrecipes.compression.quantization.quantize_codes`, nearest rounding) kept in
the kernel library's layout, value = (q - zero_point) * scale with q signed: symmetric codes as they
are (zero_point absent); asymmetric codes u in [0, 2^bits - 1] stored as q = u - 2^(bits-1) with
zero_point = -(round(lo / scale) + 2^(bits-1)). The value is what `fake_quantize` computed in training:
bit for bit when symmetric; asymmetric within one fp32 rounding of it, since training adds the grid
offset as a separately rounded product (DeepSpeed's q * scale + offset).

Forward: the input is fake-quantized when activation quantization was on (same rule as training);
then, for <= 8-bit weights whose groups are whole rows or split rows evenly (per-tensor,
per-channel, per-group layouts), `dsrecipes.kernels.int8_weight_only_matmul` (Triton where it runs,
its torch reference elsewhere); otherwise the weight is dequantized in torch and F.linear is used.

Public: `QuantizedLinear`, `pack_int4`, `unpack_int4`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dsrecipes.compression.activation_quantization import batch_range, fake_quantize_range
from dsrecipes.compression.quantization import quantize_codes

__all__ = ["QuantizedLinear", "pack_int4", "unpack_int4"]


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Integer codes in [-8, 7] (any shape) -> uint8 [ceil(numel / 2)], two codes per byte, low nibble first."""
    flat = (q.flatten().to(torch.int16) + 8).to(torch.uint8)
    if flat.numel() % 2:
        flat = torch.cat([flat, flat.new_zeros(1)])
    return flat[0::2] | (flat[1::2] << 4)


def unpack_int4(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """Inverse of `pack_int4`: int8 codes [numel]."""
    lo = (packed & 0x0F).to(torch.int8) - 8
    hi = (packed >> 4).to(torch.int8) - 8
    return torch.stack([lo, hi], dim=1).flatten()[:numel]


def _storage_kind(bits: int) -> str:
    return "int4" if bits <= 4 else ("int8" if bits <= 8 else "int16")


class QuantizedLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, weight_bits: int | None = None,
                 symmetric: bool = True, groups: int = 1, act_bits: int | None = None, act_symmetric: bool = True,
                 act_static: bool = False, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight_bits, self.symmetric, self.groups = weight_bits, symmetric, groups
        self.act_bits, self.act_symmetric, self.act_static = act_bits, act_symmetric, act_static
        numel = in_features * out_features
        if weight_bits is None:
            self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device), requires_grad=False)
        else:
            kind = _storage_kind(weight_bits)
            if kind == "int4":
                self.register_buffer("qweight", torch.empty((numel + 1) // 2, dtype=torch.uint8, device=device))
            else:
                dtype = torch.int8 if kind == "int8" else torch.int16
                self.register_buffer("qweight", torch.empty(out_features, in_features, dtype=dtype, device=device))
            self.register_buffer("scale", torch.empty(groups, dtype=torch.float32, device=device))
            if not symmetric:
                self.register_buffer("zero_point", torch.empty(groups, dtype=torch.int32, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, device=device), requires_grad=False) if bias else None
        if act_bits is not None and act_static:
            self.register_buffer("act_range", torch.zeros(2, dtype=torch.float32, device=device))

    # construction ---------------------------------------------------------------------------------

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, weight_bits: int | None, symmetric: bool = True, groups: int = 1,
                    act_bits: int | None = None, act_symmetric: bool = True,
                    act_range: torch.Tensor | None = None) -> QuantizedLinear:
        """Quantize `linear`'s weight (nearest rounding) and carry its bias and activation quantization."""
        w = linear.weight.detach().float()
        ql = cls(linear.in_features, linear.out_features, linear.bias is not None, weight_bits, symmetric, groups,
                 act_bits, act_symmetric, act_range is not None, device=w.device)
        if weight_bits is None:
            ql.weight.copy_(w)
        else:
            q, scale, zp = _codes(w, weight_bits, symmetric, groups)
            kind = _storage_kind(weight_bits)
            if kind == "int4":
                ql.qweight.copy_(pack_int4(q))
            else:
                ql.qweight.copy_(q.reshape(w.shape).to(ql.qweight.dtype))
            ql.scale.copy_(scale.flatten())
            if not symmetric:
                ql.zero_point.copy_(zp.flatten().to(torch.int32))
        if linear.bias is not None:
            ql.bias.copy_(linear.bias.detach().float())
        if act_range is not None:
            ql.act_range.copy_(act_range.detach().float())
        return ql

    def spec(self) -> dict[str, Any]:
        """What `from_spec` needs to rebuild an empty layer of this layout (stored in config.json)."""
        return {"in_features": self.in_features, "out_features": self.out_features, "bias": self.bias is not None,
                "weight_bits": self.weight_bits, "symmetric": self.symmetric, "groups": self.groups,
                "act_bits": self.act_bits, "act_symmetric": self.act_symmetric, "act_static": self.act_static}

    @classmethod
    def from_spec(cls, spec: dict[str, Any], device=None) -> QuantizedLinear:
        return cls(**spec, device=device)

    # compute --------------------------------------------------------------------------------------

    def int_codes(self) -> torch.Tensor:
        """The weight's integer codes [out, in] (int8 for <= 8 bits, int16 above)."""
        if _storage_kind(self.weight_bits) == "int4":
            return unpack_int4(self.qweight, self.in_features * self.out_features).reshape(
                self.out_features, self.in_features)
        return self.qweight

    def dequantized_weight(self) -> torch.Tensor:
        if self.weight_bits is None:
            return self.weight
        q = self.int_codes().float().reshape(self.groups, -1)
        if not self.symmetric:
            q = q - self.zero_point.float()[:, None]
        return (q * self.scale[:, None]).reshape(self.out_features, self.in_features)

    def _kernel_layout(self):
        """(scale, zero_point) in int8_weight_only_matmul's [N, K / group_size] layout, or None."""
        n, k, g = self.out_features, self.in_features, self.groups
        if g % n == 0 and k % (g // n) == 0:  # whole rows split into g / n groups each
            scale = self.scale.reshape(n, g // n)
            zp = self.zero_point.reshape(n, g // n) if not self.symmetric else None
        elif n % g == 0:  # each group is n / g whole rows: the same scale repeated per row
            scale = self.scale.repeat_interleave(n // g).reshape(n, 1)
            zp = self.zero_point.repeat_interleave(n // g).reshape(n, 1) if not self.symmetric else None
        else:
            return None
        return scale, zp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_bits is not None:
            lo, hi = (self.act_range[0], self.act_range[1]) if self.act_static else batch_range(x, self.act_symmetric)
            x = fake_quantize_range(x, lo, hi, self.act_bits, self.act_symmetric)
        if self.weight_bits is None:
            return F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        layout = self._kernel_layout() if self.weight_bits <= 8 else None
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if layout is not None and x.dtype in (torch.float32, torch.bfloat16, torch.float16):
            from dsrecipes.kernels.int8_matmul import int8_weight_only_matmul  # lazy: Triton env set by then

            return int8_weight_only_matmul(x, self.int_codes(), layout[0], layout[1], bias)
        return F.linear(x, self.dequantized_weight().to(x.dtype), bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, weight_bits={self.weight_bits}, "
                f"{'symmetric' if self.symmetric else 'asymmetric'}, groups={self.groups}, act_bits={self.act_bits}")


def _codes(w: torch.Tensor, bits: int, symmetric: bool, groups: int):
    """(q [groups, numel / groups], scale [groups, 1], zero_point [groups, 1] int32 or None) in the
    kernel layout, value (q - zero_point) * scale, holding DeepSpeed's nearest-rounded grid points.

    Always the torch quantizer: the kernel library's `quantize_int8` puts weights on its own grid
    (0-inclusive range, 255 levels), not DeepSpeed's.
    """
    codes = quantize_codes(w, bits, symmetric, groups)
    if symmetric:
        return codes.q, codes.scale, None
    half = float(2 ** (bits - 1))
    zero_point = -(codes.zero + half)
    if zero_point.abs().max() >= 2 ** 31:
        raise ValueError(f"QuantizedLinear: an asymmetric zero point ({float(zero_point.abs().max()):.3g}) "
                         "does not fit int32: the group's range is tiny next to its distance from 0; "
                         "use quantization_type='symmetric' for this weight")
    return codes.q - half, codes.scale, zero_point.to(torch.int32)
