"""Weight quantization-aware training (QAT): fake-quantized nn.Linear weights with a bit schedule.

What: the selected nn.Linear layers compute ``F.linear(x, fake_quantize(weight, bits), bias)`` in
their forward, where ``bits`` follows DeepSpeed's ``compression_training.weight_quantization``
schedule. The stored fp weights are never changed; the gradient passes through the quantizer
unchanged (straight-through estimator), so the optimizer keeps updating full-precision weights.

Quantizer: DeepSpeed's compression-training quantizers (``SymQuantizer`` / ``AsymQuantizer`` of
``deepspeed/compression/utils.py``, the last release shipping them being 0.19.6), per group:
``groups`` contiguous chunks of the flattened weight (DeepSpeed's ``quantize_groups``; 1 = per tensor),
with ``round`` = round-half-even::

    symmetric:   scale = max|w| / 2^(bits-1),  q = clamp(round(w / scale), -2^(bits-1), 2^(bits-1) - 1),
                 w_hat = q * scale
    asymmetric:  lo = min w, hi = max w (the raw range; 0 need not be inside it),
                 scale = (hi - lo) / 2^bits, offset = round(lo / scale) * scale,
                 q = clamp(round((w - offset) / scale), 0, 2^bits - 1),  w_hat = q * scale + offset

So both grids have 2^bits levels. The symmetric one clips the largest positive weight one step
(max|w| becomes (2^(bits-1) - 1) * scale); the asymmetric one, offset + [0, 2^bits - 1] * scale,
starts within half a step of lo and so ends 0.5 to 1.5 steps below hi. Computed in this order, in
fp32, so for fp32 weights w_hat equals DeepSpeed's output bit for bit.

Deliberate differences from DeepSpeed, each where DeepSpeed's result is unusable or needs more:
* a zero-range group (all zeros, e.g. a pruned row; or a constant c) gets scale = |c| / 2^(bits-1),
  or 1 when c = 0, and so dequantizes to itself; DeepSpeed divides by a zero scale (NaN).
* the arithmetic is fp32 for any weight dtype (the result is cast back), so training and the
  exported integer codes agree; DeepSpeed computes in the weight's dtype (bf16/fp16 weights can land
  on a neighbouring grid point there).
* ``rounding="stochastic"``: ``floor(t + u)``, u ~ U[0, 1), in place of ``round(t)`` before the clamp
  (unbiased inside the clamp range; pass a seeded ``torch.Generator`` for reproducibility). DeepSpeed
  accepts a ``rounding`` key but its compression quantizers always round to nearest.
* 2 bits uses the same grids; DeepSpeed switches to its ternary quantizer below 3 bits.

This is not the kernel library's int8 convention (``dsrecipes.kernels.quantization``, used by the
inference engine's int8/int4 weights: a range that includes 0 and 2^bits - 1 symmetric levels);
`quantize_codes` returns DeepSpeed's codes and `QuantizedLinear` stores them in the kernel's
``(q - zero_point) * scale`` layout so its matmul can run them. Pure torch, so it runs on CPU without
Triton and under autograd.

Bit schedule (DeepSpeed: "bits decrease by 1 every quantization_period", starting at
``schedule_offset``)::

    bits(step) = None (no quantization)                                   if step < schedule_offset
               = max(target_bits, start_bits - (step - schedule_offset) // quantization_period)  otherwise

Public: `WeightQuantConfig`, `fake_quantize`, `quantize_codes` / `dequantize_codes` / `QuantCodes`
(the integer codes behind it, for export), `bits_at`, `QuantizationAwareTraining`,
`match_module_names` (the name-pattern matcher shared with pruning).
"""

from __future__ import annotations

import fnmatch
import re
import types
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from dsrecipes.utils.dtensors import like, whole

__all__ = [
    "WeightQuantConfig",
    "fake_quantize",
    "bits_at",
    "QuantizationAwareTraining",
    "match_module_names",
    "QuantCodes",
    "quantize_codes",
    "dequantize_codes",
]

MIN_BITS = 2
MAX_BITS = 16


# --------------------------------------------------------------------------------------------------
# Module selection
# --------------------------------------------------------------------------------------------------


def _matches(name: str, pattern: str) -> bool:
    """True when `name` matches `pattern` as a glob (fnmatch, whole name) or as a regex (re.search)."""
    if pattern == "*" or fnmatch.fnmatchcase(name, pattern):
        return True
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


def match_module_names(model: nn.Module, patterns: Iterable[str], excluded: Iterable[str] = (),
                       types_: tuple[type, ...] = (nn.Linear,)) -> list[str]:
    """Qualified names of `model`'s submodules of `types_` matching any of `patterns` and none of `excluded`.

    A pattern matches as an fnmatch glob on the whole name ("layers.*.fc1") or, failing that, as a
    regex searched anywhere in the name (DeepSpeed's `modules` convention, e.g. "attention.self").
    "*" matches everything.
    """
    patterns = list(patterns)
    excluded = list(excluded)
    out = []
    for name, mod in model.named_modules():
        if not isinstance(mod, types_) or not name:
            continue
        if any(_matches(name, p) for p in patterns) and not any(_matches(name, p) for p in excluded):
            out.append(name)
    return out


# --------------------------------------------------------------------------------------------------
# Config and schedule
# --------------------------------------------------------------------------------------------------


@dataclass
class WeightQuantConfig:
    """DeepSpeed `weight_quantization` (shared_parameters + one group's params), flattened.

    start_bits/target_bits: bits at `schedule_offset` and the floor they decrease to (target <= start).
    quantization_period: steps between one-bit decreases (>= 1); 0 (DeepSpeed's XTC / ZeroQuant configs write it
        with start_bits == target_bits) quantizes at target_bits from schedule_offset on.
    schedule_offset: first step (global_step) with quantization; none before.
    quantization_type: "symmetric" | "asymmetric".
    rounding: "nearest" (round half to even) | "stochastic".
    quantize_groups: groups per weight (contiguous chunks of the flattened weight); 1 = per tensor.
        Must divide each selected weight's numel.
    modules: name patterns (glob or regex) selecting nn.Linear layers; ["*"] = all.
    excluded_modules: name patterns to leave alone.
    seed: seeds the generator used for stochastic rounding (None: torch's global RNG).
    """

    start_bits: int = 8
    target_bits: int = 8
    quantization_period: int = 1
    schedule_offset: int = 0
    quantization_type: str = "symmetric"
    rounding: str = "nearest"
    quantize_groups: int = 1
    modules: list[str] = field(default_factory=lambda: ["*"])
    excluded_modules: list[str] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self):
        if isinstance(self.modules, str):
            self.modules = [self.modules]
        self.modules = list(self.modules)
        self.excluded_modules = list(self.excluded_modules)
        for k in ("start_bits", "target_bits"):
            v = getattr(self, k)
            if not isinstance(v, int) or not MIN_BITS <= v <= MAX_BITS:
                raise ValueError(f"WeightQuantConfig.{k} must be an int in [{MIN_BITS}, {MAX_BITS}], got {v!r}")
        if self.target_bits > self.start_bits:
            raise ValueError(f"WeightQuantConfig: target_bits ({self.target_bits}) must be <= start_bits "
                             f"({self.start_bits})")
        if not isinstance(self.quantization_period, int) or self.quantization_period < 0:
            raise ValueError(f"WeightQuantConfig.quantization_period must be an int >= 0 (0: target_bits at once), got "
                             f"{self.quantization_period!r}")
        if not isinstance(self.schedule_offset, int) or self.schedule_offset < 0:
            raise ValueError(f"WeightQuantConfig.schedule_offset must be an int >= 0, got {self.schedule_offset!r}")
        if self.quantization_type not in ("symmetric", "asymmetric"):
            raise ValueError(f"WeightQuantConfig.quantization_type must be 'symmetric' or 'asymmetric', got "
                             f"{self.quantization_type!r}")
        if self.rounding not in ("nearest", "stochastic"):
            raise ValueError(f"WeightQuantConfig.rounding must be 'nearest' or 'stochastic', got {self.rounding!r}")
        if not isinstance(self.quantize_groups, int) or self.quantize_groups < 1:
            raise ValueError(f"WeightQuantConfig.quantize_groups must be an int >= 1, got {self.quantize_groups!r}")

    @classmethod
    def from_deepspeed(cls, block: dict[str, Any], group: str | None = None) -> WeightQuantConfig:
        """Build from a DeepSpeed `compression_training.weight_quantization` dict.

        Takes `shared_parameters` and the params/modules of `different_groups[group]` (the only
        group when `group` is None). Unknown DeepSpeed keys (quantizer_kernel, quantize_verbose,
        fp16_mixed_quantize, quantize_weight_in_forward, enabled) are ignored.
        """
        return cls(**deepspeed_group_kwargs(cls, block, group))


def deepspeed_group_kwargs(config_cls, block: dict[str, Any], group: str | None) -> dict[str, Any]:
    """Keyword arguments for `config_cls` from a DeepSpeed compression_training technique block.

    `shared_parameters` merged with `different_groups[group]["params"]` (the group wins; the only
    group when `group` is None), keeping the keys `config_cls` has (`modules` excepted), plus the
    group's `modules`. `excluded_modules` is a shared parameter in DeepSpeed (sparse_pruning's), so
    it is kept like the others. Shared by every technique's `from_deepspeed`.
    """
    shared = dict(block.get("shared_parameters", {}))
    groups = dict(block.get("different_groups", {}))
    if group is None:
        if len(groups) > 1:
            raise ValueError(f"from_deepspeed: several groups {sorted(groups)}; pass group=")
        group = next(iter(groups), None)
    g = groups.get(group, {}) if group is not None else {}
    names = {f for f in config_cls.__dataclass_fields__ if f != "modules"}
    kwargs = {k: v for k, v in {**shared, **dict(g.get("params", {}))}.items() if k in names}
    if "modules" in g:
        kwargs["modules"] = g["modules"]
    return kwargs


def bits_at(cfg: WeightQuantConfig, step: int) -> int | None:
    """Bits in force at `step` (None before `schedule_offset`: weights are not quantized)."""
    if step < cfg.schedule_offset:
        return None
    if cfg.quantization_period == 0:
        return cfg.target_bits
    drop = (step - cfg.schedule_offset) // cfg.quantization_period
    return max(cfg.target_bits, cfg.start_bits - drop)


# --------------------------------------------------------------------------------------------------
# Fake quantization
# --------------------------------------------------------------------------------------------------


def _round(x: torch.Tensor, rounding: str, generator: torch.Generator | None) -> torch.Tensor:
    if rounding == "nearest":
        return torch.round(x)
    if rounding == "stochastic":
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return torch.floor(x + u)
    raise ValueError(f"fake_quantize: rounding must be 'nearest' or 'stochastic', got {rounding!r}")


@dataclass
class QuantCodes:
    """One weight's DeepSpeed codes, per group ([groups, numel / groups] rows; no gradient).

    q: fp32 holding integers, in [-2^(bits-1), 2^(bits-1) - 1] (symmetric) or [0, 2^bits - 1]
    (asymmetric). scale: [groups, 1]. zero: [groups, 1] integer-valued, round(lo / scale), the
    asymmetric grid's offset in steps (None when symmetric). `dequantize_codes` gives the values.
    """

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None


def _nonzero_scale(scale: torch.Tensor, amax: torch.Tensor, bits: int) -> torch.Tensor:
    """`scale`, except where it is 0 (a zero-range group): |c| / 2^(bits-1), or 1 for an all-zero group.

    DeepSpeed divides by the zero scale there (NaN); this scale maps the constant c onto itself.
    """
    fallback = torch.where(amax > 0, amax / float(2 ** (bits - 1)), torch.ones_like(amax))
    return torch.where(scale > 0, scale, fallback)


def quantize_codes(w: torch.Tensor, bits: int, symmetric: bool, groups: int, rounding: str = "nearest",
                   generator: torch.Generator | None = None) -> QuantCodes:
    """DeepSpeed's SymQuantizer / AsymQuantizer codes of `w` per group (see the module docstring)."""
    wg = w.detach().float().reshape(groups, -1)
    amax = wg.abs().amax(-1, keepdim=True)
    if symmetric:
        half = float(2 ** (bits - 1))
        scale = _nonzero_scale(amax / half, amax, bits)
        q = _round(wg / scale, rounding, generator).clamp_(-half, half - 1)
        return QuantCodes(q, scale, None)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = _nonzero_scale((hi - lo) / float(2 ** bits), amax, bits)
    zero = torch.round(lo / scale)
    q = _round((wg - zero * scale) / scale, rounding, generator).clamp_(0.0, float(2 ** bits - 1))
    return QuantCodes(q, scale, zero)


def dequantize_codes(codes: QuantCodes) -> torch.Tensor:
    """[groups, numel / groups] fp32 values: q * scale, plus zero * scale when asymmetric (DeepSpeed's order)."""
    out = codes.q * codes.scale
    return out if codes.zero is None else out + codes.zero * codes.scale


def _fake_quantize_values(w: torch.Tensor, bits: int, symmetric: bool, groups: int, rounding: str,
                          generator: torch.Generator | None) -> torch.Tensor:
    codes = quantize_codes(w, bits, symmetric, groups, rounding, generator)
    return dequantize_codes(codes).reshape(w.shape).to(w.dtype)


def fake_quantize(w: torch.Tensor, bits: int, symmetric: bool = True, groups: int = 1,
                  rounding: str = "nearest", generator: torch.Generator | None = None) -> torch.Tensor:
    """Quantize-dequantize `w` to `bits` bits per group, with a straight-through gradient.

    Args:
        w: float tensor (any shape; groups are contiguous chunks of ``w.flatten()``).
        bits: 2..16.
        symmetric: DeepSpeed's symmetric (2^bits levels around 0) or asymmetric (2^bits levels over
            the group's raw [min, max]) grid.
        groups: number of groups; must divide ``w.numel()``. 1 = per tensor; rows of a [N, K]
            weight = per output channel.
        rounding: "nearest" (half to even) or "stochastic" (floor(x + U[0,1))).
        generator: torch.Generator for stochastic rounding (on w's device).
    Returns:
        Tensor like `w` holding the dequantized values; d(out)/d(w) is the identity (STE).
    """
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise ValueError("fake_quantize: w must be a floating-point tensor")
    if not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"fake_quantize: bits must be an int in [{MIN_BITS}, {MAX_BITS}], got {bits!r}")
    if not isinstance(groups, int) or groups < 1 or w.numel() % groups != 0:
        raise ValueError(f"fake_quantize: groups ({groups!r}) must be a positive int dividing numel ({w.numel()})")
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"fake_quantize: rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    if w.numel() == 0:
        return w
    wq = _fake_quantize_values(w, bits, symmetric, groups, rounding, generator)
    # straight-through estimator: forward value wq, gradient identity w.r.t. w
    return w + (wq - w).detach()


# --------------------------------------------------------------------------------------------------
# QAT wrapper
# --------------------------------------------------------------------------------------------------

_PATCH_ATTR = "_dsrecipes_qat"


class QuantizationAwareTraining:
    """Fake-quantize the weights of `model`'s matching nn.Linear layers in their forward.

    The layers' `forward` is replaced by an instance-level one computing
    ``F.linear(x, fake_quantize(weight, bits), bias)``; parameters, names and state-dict keys are
    untouched, and `remove()` restores the original forward. Call `step(global_step)` once per
    optimizer step (and once before training, e.g. ``step(0)``) to update the bits; before
    `schedule_offset` the layers run unquantized.

    Usage::

        qat = QuantizationAwareTraining(model, WeightQuantConfig(start_bits=8, target_bits=4,
                                                                quantization_period=100, modules=["*mlp*"]))
        for step in range(n):
            qat.step(step); loss = model(x).sum(); loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, model: nn.Module, cfg: WeightQuantConfig):
        self.model = model
        self.cfg = cfg
        self.module_names = match_module_names(model, cfg.modules, cfg.excluded_modules)
        if not self.module_names:
            raise ValueError(f"QuantizationAwareTraining: no nn.Linear matches modules={cfg.modules!r}")
        mods = dict(model.named_modules())
        for name in self.module_names:
            w = mods[name].weight
            if w.numel() % cfg.quantize_groups != 0:
                raise ValueError(f"QuantizationAwareTraining: quantize_groups ({cfg.quantize_groups}) does not "
                                 f"divide {name}.weight numel ({w.numel()})")
            if getattr(mods[name], _PATCH_ATTR, None) is not None:
                raise ValueError(f"QuantizationAwareTraining: {name} is already quantized by another instance")
        self.global_step: int | None = None
        self._bits: int | None = None
        self._generators: dict[torch.device, torch.Generator] = {}
        self._modules = {name: mods[name] for name in self.module_names}
        for mod in self._modules.values():
            setattr(mod, _PATCH_ATTR, self)
            mod.forward = types.MethodType(_qat_linear_forward, mod)

    # schedule -------------------------------------------------------------------------------------

    def step(self, global_step: int) -> int | None:
        """Set the bits for `global_step` (see `bits_at`); returns them (None = not quantizing)."""
        self.global_step = int(global_step)
        self._bits = bits_at(self.cfg, self.global_step)
        return self._bits

    def current_bits(self) -> int | None:
        """Bits the layers use now (None before schedule_offset or before the first `step`)."""
        return self._bits

    # quantization ---------------------------------------------------------------------------------

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.cfg.rounding != "stochastic" or self.cfg.seed is None:
            return None
        g = self._generators.get(device)
        if g is None:
            g = torch.Generator(device=device)
            g.manual_seed(self.cfg.seed)
            self._generators[device] = g
        return g

    def quantized_weight(self, module: nn.Linear) -> torch.Tensor:
        """The weight `module`'s forward uses now (fake-quantized, or the weight itself)."""
        w = module.weight
        if self._bits is None:
            return w
        args = (self._bits, self.cfg.quantization_type == "symmetric", self.cfg.quantize_groups, self.cfg.rounding,
                self._generator(w.device))
        if isinstance(w, DTensor):  # a tensor-parallel shard: groups and scales of the whole weight, as in one process
            with torch.no_grad():
                wq = like(fake_quantize(whole(w), *args), w)
            return w + (wq - w).detach()  # straight-through, on the shard
        return fake_quantize(w, *args)

    @torch.no_grad()
    def quantized_state_dict(self) -> dict[str, torch.Tensor]:
        """A copy of model.state_dict() whose selected weights are replaced by their fake-quantized values."""
        sd = {k: v.clone() for k, v in self.model.state_dict().items()}
        for name, mod in self._modules.items():
            sd[f"{name}.weight"] = self.quantized_weight(mod).detach().clone()
        return sd

    def remove(self) -> None:
        """Restore the layers' original forward."""
        for mod in self._modules.values():
            if "forward" in mod.__dict__:
                del mod.forward
            if getattr(mod, _PATCH_ATTR, None) is self:
                delattr(mod, _PATCH_ATTR)
        self._modules = {}

    # checkpointing --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        gens = {str(d): g.get_state() for d, g in self._generators.items()}
        return {"global_step": self.global_step, "bits": self._bits, "config": asdict(self.cfg),
                "generators": gens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = state.get("global_step")
        self._bits = bits_at(self.cfg, self.global_step) if self.global_step is not None else state.get("bits")
        for dev, gstate in state.get("generators", {}).items():
            g = self._generator(torch.device(dev))
            if g is not None:
                g.set_state(gstate)


def _qat_linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    qat: QuantizationAwareTraining = getattr(self, _PATCH_ATTR)
    return F.linear(x, qat.quantized_weight(self), self.bias)
