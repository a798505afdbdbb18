"""Activation quantization-aware training: fake-quantize the inputs of selected nn.Linear layers.

What: a forward pre-hook replaces the input x of each selected layer by its quantize-dequantize at
`bits` bits (per tensor), with a straight-through gradient, once `schedule_offset` is reached
(DeepSpeed's `compression_training.activation_quantization`). It composes with weight QAT (which
patches the layer's forward): the hook runs first, so the layer sees quantized inputs and weights.

Range calibration (DeepSpeed's `range_calibration`):
    "dynamic": the range of the current input (min/max, or max|x| when symmetric), every forward.
    "static":  a running range: the first training batch sets it, later training batches move it by
               an exponential moving average (range = (1 - momentum) * range + momentum * batch range,
               momentum 0.1 by default; DeepSpeed's QuantAct keeps 0.95 of the old range, i.e. momentum
               0.05); evaluation (module.training False) uses the stored range
               as is, which is what the exported model keeps.

Quantizer, for a range [lo, hi] (symmetric: lo = -hi = -max|.|):
    symmetric:  scale = hi / (2^(bits-1) - 1), x_hat = clamp(round(x / scale), -qmax, qmax) * scale
    asymmetric: lo = min(lo, 0), hi = max(hi, 0), scale = (hi - lo) / (2^bits - 1),
                zp = clamp(round(-lo / scale) - 2^(bits-1)), x_hat = (clamp(round(x / scale) + zp) - zp) * scale
This is the kernel library's grid (`dsrecipes.kernels.quantization`; at 8 bits exactly
`quantize_int8_reference` over the whole tensor), not DeepSpeed's: weight quantization
(`fake_quantize`) follows DeepSpeed's SymQuantizer / AsymQuantizer, activations do not yet (DeepSpeed
quantizes dynamic activations per token, with those same quantizers, and tracks a static range by an
EMA of min and max that keeps 0.95 of the old range per batch).

Public: `ActivationQuantConfig`, `ActivationQuantization`, `fake_quantize_range`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from dsrecipes.compression.quantization import deepspeed_group_kwargs, match_module_names

__all__ = ["ActivationQuantConfig", "ActivationQuantization", "fake_quantize_range"]

ACT_MIN_BITS = 4  # DeepSpeed's documented floor for activation bits
ACT_MAX_BITS = 16
RANGE_CALIBRATIONS = ("dynamic", "static")


@dataclass
class ActivationQuantConfig:
    """DeepSpeed `activation_quantization` (shared_parameters + one group's params), flattened.

    bits: 4..16.  quantization_type: "symmetric" | "asymmetric".
    range_calibration: "dynamic" | "static" (DeepSpeed's code default is dynamic).
    schedule_offset: first step with quantized activations (DeepSpeed's code default 1000).
    momentum: EMA factor of the static range, the new batch's weight (not a DeepSpeed key; DeepSpeed's
        QuantAct uses 0.05).
    modules / excluded_modules: name patterns (glob or regex) selecting nn.Linear layers.
    """

    bits: int = 8
    quantization_type: str = "symmetric"
    range_calibration: str = "dynamic"
    schedule_offset: int = 1000
    momentum: float = 0.1
    modules: list[str] = field(default_factory=lambda: ["*"])
    excluded_modules: list[str] = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.modules, str):
            self.modules = [self.modules]
        self.modules, self.excluded_modules = list(self.modules), list(self.excluded_modules)
        if not isinstance(self.bits, int) or not ACT_MIN_BITS <= self.bits <= ACT_MAX_BITS:
            raise ValueError(f"ActivationQuantConfig.bits must be an int in [{ACT_MIN_BITS}, {ACT_MAX_BITS}], "
                             f"got {self.bits!r}")
        if self.quantization_type not in ("symmetric", "asymmetric"):
            raise ValueError(f"ActivationQuantConfig.quantization_type must be 'symmetric' or 'asymmetric', got "
                             f"{self.quantization_type!r}")
        if self.range_calibration not in RANGE_CALIBRATIONS:
            raise ValueError(f"ActivationQuantConfig.range_calibration must be one of {RANGE_CALIBRATIONS}, got "
                             f"{self.range_calibration!r}")
        if not isinstance(self.schedule_offset, int) or self.schedule_offset < 0:
            raise ValueError(f"ActivationQuantConfig.schedule_offset must be an int >= 0, got {self.schedule_offset!r}")
        if not 0.0 < float(self.momentum) <= 1.0:
            raise ValueError(f"ActivationQuantConfig.momentum must be in (0, 1], got {self.momentum!r}")

    @classmethod
    def from_deepspeed(cls, block: dict[str, Any], group: str | None = None) -> ActivationQuantConfig:
        return cls(**deepspeed_group_kwargs(cls, block, group))


def fake_quantize_range(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, bits: int, symmetric: bool) -> torch.Tensor:
    """Quantize-dequantize `x` over the range [lo, hi] (0-d tensors) with a straight-through gradient."""
    xf = x.detach().float()
    if symmetric:
        qmax = float(2 ** (bits - 1) - 1)
        scale = torch.maximum(lo.abs(), hi.abs()).float() / qmax
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        out = torch.round(xf / scale).clamp_(-qmax, qmax) * scale
    else:
        qmin, qmax = float(-(2 ** (bits - 1))), float(2 ** (bits - 1) - 1)
        lo_, hi_ = lo.float().clamp(max=0.0), hi.float().clamp(min=0.0)
        scale = (hi_ - lo_) / float(2 ** bits - 1)
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        zp = (torch.round(-lo_ / scale) + qmin).clamp(qmin, qmax)
        out = ((torch.round(xf / scale) + zp).clamp_(qmin, qmax) - zp) * scale
    return x + (out.to(x.dtype) - x).detach()


def batch_range(x: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    xd = x.detach().float()
    if symmetric:
        a = xd.abs().amax()
        return -a, a
    return xd.amin(), xd.amax()


class ActivationQuantization:
    """Fake-quantize the inputs of `model`'s matching nn.Linear layers (forward pre-hooks).

    Call `step(global_step)` once per optimizer step (and before training); `remove()` drops the hooks.
    Static ranges live here (`ranges`, saved by `state_dict()`), not in the model's state dict.
    """

    def __init__(self, model: nn.Module, cfg: ActivationQuantConfig):
        self.model, self.cfg = model, cfg
        self.module_names = match_module_names(model, cfg.modules, cfg.excluded_modules)
        if not self.module_names:
            raise ValueError(f"ActivationQuantization: no nn.Linear matches modules={cfg.modules!r}")
        mods = dict(model.named_modules())
        self.symmetric = cfg.quantization_type == "symmetric"
        self.active = False
        self.global_step: int | None = None
        self.ranges: dict[str, torch.Tensor] = {}  # name -> tensor([lo, hi]) (static calibration)
        self._handles = [mods[n].register_forward_pre_hook(self._hook(n)) for n in self.module_names]

    def _hook(self, name: str):
        def hook(module: nn.Module, args):
            if not self.active:
                return None
            x = args[0]
            return (self.quantize_input(name, x, module.training),) + tuple(args[1:])

        return hook

    def quantize_input(self, name: str, x: torch.Tensor, training: bool) -> torch.Tensor:
        """The quantized input layer `name` sees (updates the static range when `training`)."""
        if self.cfg.range_calibration == "dynamic":
            lo, hi = batch_range(x, self.symmetric)
            return fake_quantize_range(x, lo, hi, self.cfg.bits, self.symmetric)
        r = self.ranges.get(name)
        if training or r is None:
            lo, hi = batch_range(x, self.symmetric)
            new = torch.stack([lo, hi])
            r = new if r is None else (1 - self.cfg.momentum) * r.to(new.device) + self.cfg.momentum * new
            self.ranges[name] = r
        return fake_quantize_range(x, r[0], r[1], self.cfg.bits, self.symmetric)

    def step(self, global_step: int) -> bool:
        """Switch quantization on from `schedule_offset`; returns whether it is on."""
        self.global_step = int(global_step)
        self.active = self.global_step >= self.cfg.schedule_offset
        return self.active

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def state_dict(self) -> dict[str, Any]:
        return {"global_step": self.global_step, "ranges": {n: r.detach().cpu() for n, r in self.ranges.items()},
                "config": asdict(self.cfg)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ranges = {n: r.clone() for n, r in state.get("ranges", {}).items()}
        if state.get("global_step") is not None:
            self.step(state["global_step"])
