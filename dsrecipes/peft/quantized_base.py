"""QLoRA-style frozen bases: a LoRA-wrapped Linear's weight kept as int8 or packed int4 codes, dequantized per call.

    quantize_bases(model, bits=8)          # every LoRALinear.base_layer -> FrozenQuantizedLinear
    state = dequantized_state(state)       # a state dict's codes back to `x.base_layer.weight` (for the export)

The codes come from dsrecipes' own quantizers: int8 symmetric per output channel
(dsrecipes.kernels.quantization.quantize_int8_reference), int4 symmetric per group of `group_size` inputs, two
values a byte (dsrecipes.inference.quantized.pack_int4). Only the base is quantized; the adapters, which train,
stay in floating point, and the forward dequantizes the weight into the input's dtype and runs F.linear, so
gradients flow to the input (and from there to every adapter before it) as through the float layer, with the
quantized weight in their place. What it saves: the frozen weights' bytes, 4x (int8) or 8x (int4) against fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dsrecipes.peft.lora import lora_modules

QUANT_BITS = (8, 4)


class FrozenQuantizedLinear(nn.Module):
    """y = x @ dequant(codes).T + bias; the codes and scales are buffers (in state dicts and checkpoints), nothing
    of it trains."""

    def __init__(self, linear: nn.Linear, bits: int, group_size: int):
        super().__init__()
        from dsrecipes.inference.quantized import pack_int4
        from dsrecipes.kernels.quantization import quantize_int8_reference

        weight = linear.weight.detach().float()
        self.in_features, self.out_features, self.bits = linear.in_features, linear.out_features, int(bits)
        if self.bits == 8:
            codes, scale, _ = quantize_int8_reference(weight, "symmetric", "channel")
        else:
            codes, scale = pack_int4(weight, group_size)
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        bias = linear.bias
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.codes, self.scale, self.bits, dtype)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (read-only, a new tensor each time): for code that reads a Linear's weight."""
        return self.dequantized_weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int{self.bits} (frozen)"


def dequantize(codes: torch.Tensor, scale: torch.Tensor, bits: int, dtype: torch.dtype = torch.float32):
    """The float weight of int8 codes (per-channel scales) or packed int4 codes (per-group scales)."""
    if bits == 8:
        from dsrecipes.kernels.quantization import dequantize_int8_reference

        return dequantize_int8_reference(codes, scale, dtype=dtype)
    from dsrecipes.inference.quantized import unpack_int4

    return unpack_int4(codes, scale, dtype)


def check_quantizable(model: nn.Module, bits: int, group_size: int, prefix: str = "peft") -> None:
    """ValueError naming the first adapted Linear whose input size the int4 groups do not divide."""
    if bits == 4:
        for name, module in lora_modules(model).items():
            if module.in_features % group_size or group_size % 2:
                raise ValueError(f"{prefix}.quantize_group_size={group_size} must be even and divide the input size of "
                                 f"every adapted Linear; {name} has {module.in_features}")


@torch.no_grad()
def quantize_bases(model: nn.Module, bits: int, group_size: int = 64) -> int:
    """Replace every LoRALinear's base_layer by a FrozenQuantizedLinear; returns the bytes the weights took before
    minus after."""
    if bits not in QUANT_BITS:
        raise ValueError(f"peft.quantize_base=int{bits} is not valid; choose int8 or int4")
    check_quantizable(model, bits, group_size)
    saved = 0
    for module in lora_modules(model).values():
        base = module.base_layer
        quantized = FrozenQuantizedLinear(base, bits, group_size)
        saved += base.weight.numel() * base.weight.element_size() - sum(
            t.numel() * t.element_size() for t in (quantized.codes, quantized.scale))
        module.base_layer = quantized
    return saved


def dequantized_state(state: dict) -> dict:
    """A state dict with every `x.base_layer.codes` / `.scale` pair replaced by the float `x.base_layer.weight` (the
    bits told by the codes' dtype: int8 or packed uint8), other keys unchanged, in order."""
    out = {}
    for key, tensor in state.items():
        if key.endswith(".base_layer.scale"):
            continue
        if key.endswith(".base_layer.codes"):
            stem = key[: -len("codes")]
            bits = 8 if tensor.dtype == torch.int8 else 4
            out[stem + "weight"] = dequantize(tensor, state[stem + "scale"], bits)
            continue
        out[key] = tensor
    return out
