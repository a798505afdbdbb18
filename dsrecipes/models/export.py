"""dsrecipes' own export layout (safetensors plus its config), and loading either export layout back.

    <dir>/model.safetensors   full-precision weights under dsrecipes' names (a tied weight stored once;
                              aliases in metadata)
    <dir>/config.json         {"model": ModelConfig fields, "moe": MoEConfig fields (MoE models only),
                               "tokenizer": "byte" | path, ...}

The Trainer and `python -m dsrecipes.export` write the Hugging Face layout instead
(dsrecipes.models.hf_export), except for MoE models; compressed exports use this one.
`load_exported` reads both.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dsrecipes.models.config import ModelConfig
from dsrecipes.models.gpt import GPT
from dsrecipes.models.hf_config import is_hf_config
from dsrecipes.models.moe_config import MoEConfig
from dsrecipes.models.weights import assign_state

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def export_safetensors(
    state_dict: dict, model_cfg: ModelConfig, out_dir: str | Path, extra: dict | None = None, moe_cfg: MoEConfig | None = None
) -> Path:
    """Write the weights (fp32 as given) and config; returns the weights file. Shared tensors stored once.

    An MoE model's state dict must hold all experts (the Engine's module_state_dict gathers them);
    its moe config is stored with ep_size=1, so the export loads on one device.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors, aliases, owner_of = {}, {}, {}
    for name, tensor in state_dict.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in owner_of:
            aliases[name] = owner_of[key]
        else:
            owner_of[key] = name
            tensors[name] = tensor.detach().to("cpu").contiguous()
    weights = out_dir / WEIGHTS_FILE
    save_file(tensors, str(weights), metadata={"aliases": json.dumps(aliases), "format": "pt"})
    config = {"model": dataclasses.asdict(model_cfg), **(extra or {})}
    if moe_cfg is not None and moe_cfg.enabled:
        config["moe"] = {**dataclasses.asdict(moe_cfg), "ep_size": 1}
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    return weights


def read_config(path: str | Path, what: str = "dsrecipes export") -> dict:
    """config.json of an export directory; FileNotFoundError naming the missing file."""
    path = Path(path)
    for required in (WEIGHTS_FILE, CONFIG_FILE):
        if not (path / required).exists():
            raise FileNotFoundError(f"{path} is not a {what}: {required} is missing")
    return json.loads((path / CONFIG_FILE).read_text())


def load_weights_into(model: GPT, path: str | Path, device: str | torch.device = "cpu", tie: bool = True) -> GPT:
    """Assign the export's tensors (aliases restored) to a meta-built `model`; re-tie and rebuild rope."""
    with safe_open(str(Path(path) / WEIGHTS_FILE), framework="pt", device=str(device)) as f:
        aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
        state = {name: f.get_tensor(name) for name in f.keys()}
    for alias, owner in aliases.items():
        state[alias] = state[owner]
    return assign_state(model, state, device, tie)


def load_exported(path: str | Path, device: str | torch.device = "cpu") -> tuple[GPT, dict]:
    """(model, config dict) from an export directory; errors name the missing file.

    Both layouts: dsrecipes' own (this module) and the Hugging Face one (dsrecipes.models.hf_export, what
    the Trainer writes; any supported HF checkpoint directory too, dsrecipes.models.hf_import). The dict
    is dsrecipes' view either way: {"model": ModelConfig fields, "tokenizer": "byte" or a path, ...}.
    """
    if (Path(path) / CONFIG_FILE).is_file() and is_hf_config(json.loads((Path(path) / CONFIG_FILE).read_text())):
        from dsrecipes.models.hf_import import load_hf_checkpoint

        return load_hf_checkpoint(path, device)
    config = read_config(path)
    if config.get("tokenizer"):
        from dsrecipes.models.hf_tokenizer import resolve_tokenizer

        config["tokenizer"] = resolve_tokenizer(config["tokenizer"], path)
    with torch.device("meta"):
        moe = MoEConfig(**config["moe"]) if config.get("moe") else None
        model = GPT(ModelConfig(**config["model"]), moe=moe)
    return load_weights_into(model, path, device), config
