"""Redundancy clean: turn masks and fake quantization into an actually smaller model (DeepSpeed's
`redundancy_clean`).

`redundancy_clean(model, compressor)` returns a new module (the training model is left as it is):
  1. sparse-pruning masks multiplied in (unstructured zeros stay dense: they shrink nothing);
  2. pruned rows / heads / channels removed from every tensor they span (nn.Linear / conv rows and
     bias, consumer columns, BatchNorm vectors and running statistics), module sizes and attention
     head counts (`n_head`, `n_kv_head` attributes of the attention module) updated;
  3. each weight-quantized nn.Linear replaced by a `QuantizedLinear` holding integer codes + scales,
     and each activation-quantized one carrying its activation quantizer (static range included).
Quantization is redone on the shrunk weight with nearest rounding. When `quantize_groups` no
longer divides the shrunk weight, the largest divisor of both is used (recorded in the layer).
A weight shared with another parameter (tied embeddings) is kept in float, with a warning.

Public: `redundancy_clean`, `state_dict_bytes`.
"""

from __future__ import annotations

import copy
import logging
import math

import torch
from torch import nn

from dsrecipes.compression.quantization import _PATCH_ATTR
from dsrecipes.compression.quantized_linear import QuantizedLinear
from dsrecipes.compression.structured_pruning import StructuredPruner

__all__ = ["redundancy_clean", "state_dict_bytes"]

log = logging.getLogger("dsrecipes")

_NORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def state_dict_bytes(module_or_state) -> int:
    """Bytes of a module's state (parameters + persistent buffers), a shared tensor counted once."""
    state = module_or_state.state_dict() if isinstance(module_or_state, nn.Module) else module_or_state
    seen, total = set(), 0
    for t in state.values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def _set_module(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def _strip_compression_hooks(model: nn.Module, act_names) -> None:
    """Drop the fake-quantization forward patches and activation hooks the deep copy carried over."""
    mods = dict(model.named_modules())
    for mod in mods.values():
        if _PATCH_ATTR in mod.__dict__:
            mod.__dict__.pop("forward", None)
            delattr(mod, _PATCH_ATTR)
    for name in act_names:
        mods[name]._forward_pre_hooks.clear()


@torch.no_grad()
def _index(t: torch.Tensor, dim: int, idx: torch.Tensor) -> nn.Parameter | torch.Tensor:
    return t.index_select(dim, idx.to(t.device)).clone()


@torch.no_grad()
def _shrink(model: nn.Module, pruner: StructuredPruner) -> None:
    mods = dict(model.named_modules())
    for g in pruner.groups.values():
        if g.keep is None:
            continue
        kept_heads = int(g.keep.sum())
        shrunk = {"q": False, "kv": False}
        for t in g.targets:
            m = mods[t.module]
            idx = g.element_mask(t).nonzero().flatten()
            if t.dim == -1 or isinstance(m, _NORM):
                for attr in ("weight", "bias", "running_mean", "running_var"):
                    v = getattr(m, attr, None)
                    if v is not None:
                        new = _index(v, 0, idx)
                        setattr(m, attr, nn.Parameter(new, requires_grad=v.requires_grad)
                                if isinstance(v, nn.Parameter) else new)
                m.num_features = len(idx)
                continue
            m.weight = nn.Parameter(_index(m.weight, t.dim, idx), requires_grad=m.weight.requires_grad)
            if t.dim == 0 and getattr(m, "bias", None) is not None:
                m.bias = nn.Parameter(_index(m.bias, 0, idx), requires_grad=m.bias.requires_grad)
            if isinstance(m, nn.Linear):
                m.out_features, m.in_features = m.weight.shape[0], m.weight.shape[1]
            else:  # conv
                m.out_channels, m.in_channels = m.weight.shape[0], m.weight.shape[1] * m.groups
            if g.heads and t.dim == 0:
                shrunk["q" if t.repeat == 1 else "kv"] = True
        if g.heads:
            attn = mods.get(g.name.rpartition(".")[0])
            if attn is not None and hasattr(attn, "n_head"):
                if not (shrunk["q"] and shrunk["kv"]):
                    raise ValueError("head_pruning.related_modules must name both the query and the key/value "
                                     f"projections of {g.name} (e.g. ['q_proj', 'kv_proj']) for redundancy_clean")
                attn.n_head = kept_heads
                if hasattr(attn, "n_kv_head"):
                    attn.n_kv_head = kept_heads


def _shared_weight_ids(model: nn.Module) -> set[int]:
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    return {i for i, c in counts.items() if c > 1}


@torch.no_grad()
def redundancy_clean(model: nn.Module, compressor) -> nn.Module:
    """A smaller copy of `model` with `compressor`'s masks, removals and quantization made real.

    `compressor` is a `dsrecipes.compression.Compressor` (see `init_compression`).
    """
    act = compressor.activation_quant
    act_names = act.module_names if act is not None else []
    clean = copy.deepcopy(model)
    _strip_compression_hooks(clean, act_names)
    mods = dict(clean.named_modules())
    if compressor.sparse is not None:
        for name, mask in compressor.sparse.masks.items():
            mods[name].weight.mul_(mask.to(mods[name].weight.device, mods[name].weight.dtype))
    for pruner in compressor.structured:
        _shrink(clean, pruner)
    qat = compressor.weight_quant
    bits = qat.current_bits() if qat is not None else None
    wq_names = set(qat.module_names) if (qat is not None and bits is not None) else set()
    aq_names = set(act_names) if (act is not None and act.active) else set()
    shared = _shared_weight_ids(clean)
    mods = dict(clean.named_modules())
    for name in sorted(wq_names | aq_names):
        lin = mods[name]
        w_bits = bits if name in wq_names else None
        if w_bits is not None and id(lin.weight) in shared:
            log.warning("redundancy_clean: %s.weight is shared with another parameter (tied); kept in float", name)
            w_bits = None
        groups = qat.cfg.quantize_groups if w_bits is not None else 1
        if w_bits is not None and lin.weight.numel() % groups:
            groups = math.gcd(groups, lin.weight.numel())
        if w_bits is None and name not in aq_names:
            continue
        act_kwargs = {}
        if name in aq_names:
            static = act.cfg.range_calibration == "static"
            act_kwargs = dict(act_bits=act.cfg.bits, act_symmetric=act.symmetric,
                              act_range=act.ranges.get(name) if static else None)
            if static and name not in act.ranges:
                raise ValueError(f"redundancy_clean: static activation range of {name} was never calibrated "
                                 "(run at least one training forward after activation_quantization.schedule_offset)")
        new = QuantizedLinear.from_linear(lin, w_bits, symmetric=(qat.cfg.quantization_type == "symmetric")
                                          if qat is not None else True, groups=groups, **act_kwargs)
        _set_module(clean, name, new)
    clean.eval()
    return clean
