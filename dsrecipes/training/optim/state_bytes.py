"""Optimizer-state bytes per trained parameter, by option: what the estimator counts and the layout line states.

    counted = optimizer_state_of(cfg.optimizer, model)   # StateBytes(per_param=5.1, description="muon: ...")
    held = held_state_bytes(optimizer)                   # what a built optimizer's state tensors hold, measured

Per element of a trained parameter: Adam-family and LAMB 8 (two fp32 moments), Lion, Adagrad and SGD with momentum 4,
plain SGD 0, anything else 8; optimizer.state_dtype=bf16 halves the Adam family's (two bf16 moments, 4);
optimizer=adamw8bit (torchao) holds two 8-bit codes and, per moment, one fp32 scale per block_size elements
(2 + 8 / block_size: 2.03 at the default 256; the estimator's integer figure is 2) for a tensor of at least 4096
elements that block_size divides, and fp32 moments (8) for the others, as torchao (after bitsandbytes) does: with a
model the figure is weighed over its tensors (torchao decides per local shard; the whole tensor is counted here),
with the 256-entry fp32 code table each quantized moment carries (2 KiB per quantized tensor).
optimizer=muon is a mix: a Muon matrix holds its momentum (4), the Adam half its two moments
(8), so its figure is the element-weighted mean over the model's trained parameters as optimizer.muon_params /
adam_params split them (dsrecipes.training.optim.muon_params). Without a model, Muon counts its Adam half's 8 (the
most any of its parameters holds).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dsrecipes.utils.dtensors import local

_STATE_BYTES = {"adamw": 8, "adam": 8, "lamb": 8, "lion": 4, "adagrad": 4, "muon": 8, "adamw8bit": 2}
MUON_MOMENTUM_BYTES = 4


def optimizer_state_bytes(name: str, momentum: float = 0.0) -> int:
    """Bytes per element of the optimizer's largest state (the figure for a whole-model count without the model)."""
    if name == "sgd":
        return 4 if momentum else 0
    return _STATE_BYTES.get(name, 8)


@dataclass(frozen=True)
class StateBytes:
    per_param: float  # bytes per trained parameter, on average over the model's trained parameters
    description: str  # the layout line's `optimizer:` part


def optimizer_state_of(optimizer, model: nn.Module | None = None, bf16_weights: bool = False) -> StateBytes:
    """The state bytes per trained parameter of the optimizer option `optimizer` on `model`; bf16_weights
    (precision.master_dtype=bf16): the optimizer steps bf16 weights, and torch keeps their state in bf16 (half)."""
    counted = _state_of(optimizer, model)
    if not bf16_weights:
        return counted
    half = counted.per_param / 2
    return StateBytes(half, f"{optimizer.name}, state {half:g} B/param (bf16, the dtype of the weights it steps)")


def _state_of(optimizer, model: nn.Module | None) -> StateBytes:
    name = str(optimizer.name)
    whole = optimizer_state_bytes(name, float(getattr(optimizer, "momentum", 0.0) or 0.0))
    if str(getattr(optimizer, "state_dtype", "fp32")) == "bf16":  # CompactAdam: two bf16 moments
        return StateBytes(whole / 2, f"{name}, state {whole // 2} B/param (bf16 moments, stochastic rounding)")
    if name == "adamw8bit":
        return _adamw8bit_state(int(optimizer.block_size), model)
    if name != "muon" or model is None:
        return StateBytes(float(whole), f"{name}, state {whole} B/param")
    from dsrecipes.training.optim.muon_params import muon_names

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    chosen = muon_names(named, list(optimizer.muon_params), list(optimizer.adam_params))
    muon = sum(p.numel() for n, p in named if n in chosen)
    total = sum(p.numel() for _, p in named) or 1
    per_param = (MUON_MOMENTUM_BYTES * muon + whole * (total - muon)) / total
    return StateBytes(per_param, f"muon, state {per_param:.2f} B/param (Muon momentum {MUON_MOMENTUM_BYTES} B on "
                                 f"{muon / total:.1%} of the parameters, Adam {whole} B on the rest)")


QUANTIZED_MIN_NUMEL = 4096  # torchao's AdamW8bit keeps smaller tensors' moments in fp32
CODE_TABLE_BYTES = 2 * 256 * 4  # per quantized tensor: each of its two moments' 256-entry fp32 code table


def _adamw8bit_state(block: int, model: nn.Module | None) -> StateBytes:
    quantized = 2 + 2 * 4 / block  # two 1-byte codes, and per moment one fp32 scale a block
    sizes = [p.numel() for p in model.parameters() if p.requires_grad] if model is not None else []
    total = sum(sizes)
    if not total:
        return StateBytes(quantized, f"adamw8bit, state {quantized:.2f} B/param (8-bit moments, fp32 scale per "
                                     f"{block} elements)")
    small = sum(n for n in sizes if n < QUANTIZED_MIN_NUMEL or n % block)
    tables = CODE_TABLE_BYTES * sum(1 for n in sizes if n >= QUANTIZED_MIN_NUMEL and not n % block)
    per_param = (quantized * (total - small) + 8 * small + tables) / total
    return StateBytes(per_param, f"adamw8bit, state {per_param:.2f} B/param (8-bit moments, fp32 scale per {block} "
                                 f"elements, on {(total - small) / total:.1%} of the parameters; fp32 on tensors under "
                                 f"{QUANTIZED_MIN_NUMEL} elements)")


def held_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes the optimizer's state tensors hold on this rank: a DTensor's local shard, a tensor subclass's inner
    tensors (torchao's 8-bit state: codes, scales, code table), scalars (`step`) included."""
    return sum(_tensor_bytes(local(value)) for state in optimizer.state.values() for value in state.values()
               if isinstance(value, torch.Tensor))


def _tensor_bytes(tensor: torch.Tensor) -> int:
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if callable(flatten) and type(tensor) is not torch.Tensor:
        names, _ = flatten()
        return sum(_tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()
