"""Save a redundancy-cleaned GPT (dsrecipes.compression.redundancy_clean) as safetensors + config, and load it back for inference.

    <dir>/model.safetensors   int codes (int8, packed int4 as uint8, int16), fp32 scales / zero points,
                              float weights of unquantized layers (a tied weight stored once)
    <dir>/config.json         {"model": ModelConfig fields (n_layer after layer reduction),
                               "compression": {"layers": {name: layout}, "attention": {name: [n_head, n_kv_head]}},
                               ...extra}

`layers` records every linear whose layout differs from a freshly built GPT of that config
(smaller after row/head pruning, or a QuantizedLinear); `load_compressed` builds the GPT on the meta
device, swaps those layers in, sets the attention head counts, and assigns the stored tensors.

Public: `export_compressed`, `load_compressed`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from dsrecipes.compression.clean import _set_module, state_dict_bytes
from dsrecipes.compression.quantized_linear import QuantizedLinear
from dsrecipes.models.config import ModelConfig
from dsrecipes.models.export import export_safetensors, load_weights_into, read_config
from dsrecipes.models.gpt import GPT

__all__ = ["export_compressed", "load_compressed"]


def _structure(model: GPT) -> dict:
    with torch.device("meta"):
        base = GPT(model.cfg)
    base_mods = dict(base.named_modules())
    layers, attention = {}, {}
    for name, mod in model.named_modules():
        if isinstance(mod, QuantizedLinear):
            layers[name] = {"kind": "quantized", **mod.spec()}
        elif isinstance(mod, nn.Linear):
            ref = base_mods.get(name)
            if not isinstance(ref, nn.Linear) or ref.weight.shape != mod.weight.shape:
                layers[name] = {"kind": "linear", "in_features": mod.in_features, "out_features": mod.out_features,
                                "bias": mod.bias is not None}
        if hasattr(mod, "n_head") and hasattr(mod, "n_kv_head"):
            ref = base_mods.get(name)
            if (mod.n_head, mod.n_kv_head) != (getattr(ref, "n_head", None), getattr(ref, "n_kv_head", None)):
                attention[name] = [mod.n_head, mod.n_kv_head]
    return {"layers": layers, "attention": attention}


def export_compressed(model: GPT, out_dir: str | Path, extra: dict | None = None) -> dict:
    """Write the cleaned `model` (a GPT from `redundancy_clean`); returns {"path", "bytes", "file_bytes"}."""
    out_dir = Path(out_dir)
    structure = _structure(model)
    state = {k: v for k, v in model.state_dict().items()}
    weights = export_safetensors(state, model.cfg, out_dir, extra={"compression": structure, **(extra or {})})
    return {"path": str(out_dir), "bytes": state_dict_bytes(state), "file_bytes": weights.stat().st_size}


def load_compressed(path: str | Path, device: str | torch.device = "cpu") -> tuple[GPT, dict]:
    """(model in eval mode, config dict) from an `export_compressed` directory."""
    config = read_config(path, "dsrecipes compressed export")
    structure = config.get("compression", {"layers": {}, "attention": {}})
    with torch.device("meta"):
        model = GPT(ModelConfig(**config["model"]))
        for name, spec in structure["layers"].items():
            spec = dict(spec)
            kind = spec.pop("kind")
            if kind == "quantized":
                new = QuantizedLinear.from_spec(spec)
            else:
                new = nn.Linear(spec["in_features"], spec["out_features"], bias=spec["bias"])
            _set_module(model, name, new)
    for name, (n_head, n_kv) in structure["attention"].items():
        attn = model.get_submodule(name)
        attn.n_head, attn.n_kv_head = n_head, n_kv
    model = load_weights_into(model, path, device, tie=not isinstance(model.lm_head, QuantizedLinear))
    return model.eval(), config
