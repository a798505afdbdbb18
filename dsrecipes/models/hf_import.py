"""Import a Hugging Face GPT-2 / Llama / Mistral / Qwen2 / Qwen3 checkpoint directory as dsrecipes' GPT (native).

    model, config = load_hf_checkpoint("DIR")        # or a hub name (owner/name) when online
    python -m dsrecipes model=hf model.path=DIR data.block_size=128        # fine-tune it
    python -m dsrecipes mode=generate checkpoint=DIR prompt="Hello"       # generate with its tokenizer

A checkpoint is a directory with config.json (with a model_type) and model.safetensors, sharded
model-*.safetensors with their index, or pytorch_model.bin (what save_pretrained writes, and
dsrecipes' own export). The shape comes from config.json (dsrecipes.models.hf_config), the tensors
are renamed and re-laid out by dsrecipes.models.hf_weights, and the tokenizer is the directory's
tokenizer.json. The model is dsrecipes' own GPT, so the recipe's features (ZeRO, TP / SP / PP, kernels,
compression) apply to it; MoE does not (a dense checkpoint has no experts). Other architectures train as the
Hugging Face module (dsrecipes.models.hf_module); this module refuses them, saying why.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

from dsrecipes.models.config import ModelConfig
from dsrecipes.models.gpt import GPT
from dsrecipes.models.hf_config import (
    CONFIG_FILE,
    DSRECIPES_KEY,
    model_config_from_hf,
    model_type_of,
    read_hf_config,
    resolve_checkpoint_dir,
)
from dsrecipes.models.hf_tokenizer import TOKENIZER_FILE, resolve_tokenizer
from dsrecipes.models.hf_weights import from_hf_state
from dsrecipes.models.weights import assign_state

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
TORCH_BIN, TORCH_BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
# Fields of a given model config that must match the checkpoint (the rest, e.g. max_seq_len or dropout, may differ).
MATCHING = ("style", "n_layer", "n_head", "kv_heads", "d_model", "ffn_dim", "vocab_size", "tie_embeddings")


def weight_files(directory: str | os.PathLike) -> list[Path]:
    """The weight files of a checkpoint directory (single or sharded; safetensors preferred), [] when none."""
    directory = Path(directory)
    for single, index in ((SAFETENSORS, SAFETENSORS_INDEX), (TORCH_BIN, TORCH_BIN_INDEX)):
        if (directory / single).is_file():
            return [directory / single]
        if (directory / index).is_file():
            shards = sorted(set(json.loads((directory / index).read_text())["weight_map"].values()))
            return [directory / name for name in shards]
    return []


def is_hf_checkpoint(path: str | os.PathLike) -> bool:
    """A directory holding a Hugging Face config.json (with a model_type) and weights."""
    path = Path(path)
    if not (path / CONFIG_FILE).is_file() or not weight_files(path):
        return False
    try:
        return "model_type" in json.loads((path / CONFIG_FILE).read_text())
    except json.JSONDecodeError:
        return False


def read_hf_state(directory: str | os.PathLike) -> dict:
    """Every tensor of a checkpoint directory by its HF name (as stored: any dtype, CPU)."""
    files = weight_files(directory)
    if not files:
        raise ValueError(f"{directory}: no weights ({SAFETENSORS}, {SAFETENSORS_INDEX}, {TORCH_BIN} or {TORCH_BIN_INDEX})")
    state = {}
    for file in files:
        if not file.is_file():
            raise ValueError(f"{directory}: weight shard {file.name} named by its index is missing")
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            state.update(load_file(str(file)))
        else:
            state.update(torch.load(file, map_location="cpu", weights_only=True))
    return state


def hf_tokenizer_spec(directory: str | os.PathLike, config: dict | None = None) -> str | None:
    """The checkpoint's tokenizer for build_tokenizer: dsrecipes' record ("byte" or a path), else its tokenizer.json."""
    directory = Path(directory)
    config = config if config is not None else read_hf_config(directory)
    recorded = config.get(DSRECIPES_KEY, {}).get("tokenizer")
    if recorded:
        return resolve_tokenizer(recorded, directory)
    return str((directory / TOKENIZER_FILE).resolve()) if (directory / TOKENIZER_FILE).is_file() else None


def check_model_matches(given: ModelConfig, stored: ModelConfig, source: str) -> None:
    """ValueError naming every shape field where the recipe's model differs from the checkpoint's config.json."""
    diffs = [f"model.{k}={getattr(given, k)!r} (checkpoint: {getattr(stored, k)!r})" for k in MATCHING
             if getattr(given, k) != getattr(stored, k)]
    if diffs:
        raise ValueError(f"the model config does not match Hugging Face checkpoint {source}: {'; '.join(diffs)}; use "
                         f"model=hf model.path={source} (its config.json gives the shape)")


def read_hf_checkpoint(path: str | os.PathLike, model_cfg: ModelConfig | None = None) -> tuple[ModelConfig, dict, dict]:
    """(model config, dsrecipes state dict in float32, config view) of a checkpoint directory or hub name.

    The view is what dsrecipes.models.load_exported returns for its own layout: {"model": ModelConfig
    fields, "tokenizer": "byte" | a tokenizer.json path | None, "hf": config.json, ...dsrecipes' record}.
    model_cfg: the recipe's model (its shape must match; max_seq_len, dropout and the like may differ).
    """
    directory = resolve_checkpoint_dir(path)
    source = str(path)
    config = read_hf_config(directory)
    model_type = model_type_of(config, source)
    try:
        stored = model_config_from_hf(config, source=source, name=Path(source).name, impl="native")
    except ValueError as why:
        reason = str(why).split(": ", 2)[-1].split("; model.impl=auto")[0]
        raise ValueError(f"{source}: dsrecipes' GPT cannot load this checkpoint ({reason}); it trains as the Hugging "
                         f"Face module itself: model=hf model.path={source}") from None
    if model_cfg is not None:
        check_model_matches(model_cfg, stored, source)
    cfg = model_cfg or stored
    state = from_hf_state(read_hf_state(directory), cfg, model_type, source)
    record = {k: v for k, v in config.get(DSRECIPES_KEY, {}).items() if k != "model"}
    hf = {k: v for k, v in config.items() if k != DSRECIPES_KEY}
    view = {**record, "model": dataclasses.asdict(cfg), "tokenizer": hf_tokenizer_spec(directory, config), "hf": hf}
    return cfg, state, view


def check_state_matches(model: GPT, state: dict, source: str) -> None:
    """ValueError naming the first missing, unexpected or wrongly shaped tensor (nothing is loaded)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    given = {k: tuple(v.shape) for k, v in state.items()}
    for name in sorted(set(expected) | set(given)):
        if expected.get(name) != given.get(name):
            raise ValueError(f"{source}: tensor {name} has shape {given.get(name)} in the checkpoint but "
                             f"{expected.get(name)} in model {model.cfg.name}")


def load_hf_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu",
                       model_cfg: ModelConfig | None = None) -> tuple[GPT, dict]:
    """(dsrecipes GPT with the checkpoint's weights on `device`, float32, in eval mode; the config view)."""
    cfg, state, view = read_hf_checkpoint(path, model_cfg)
    with torch.device("meta"):
        model = GPT(cfg)
    check_state_matches(model, state, str(path))
    return assign_state(model, state, device).eval(), view


def refuse_moe_on_checkpoint(model_cfg: ModelConfig, moe=None) -> None:
    """ValueError when the recipe asks for dsrecipes MoE layers on a dense checkpoint's native blocks."""
    if moe is not None and getattr(moe, "enabled", False):
        raise ValueError(f"model.path={model_cfg.path!r} with moe.num_experts={moe.num_experts}: a Hugging Face "
                         "checkpoint's dense MLPs have no experts to load into; use moe=none")


def gpt_from_hf(model_cfg: ModelConfig, device: str | torch.device, moe=None) -> GPT:
    """The Trainer's model for model.path=DIR: GPT(model_cfg) with DIR's weights, in training mode."""
    refuse_moe_on_checkpoint(model_cfg, moe)
    return load_hf_checkpoint(model_cfg.path, device, model_cfg)[0].train()


def tokenizer_for_training(model_path: str, data_tokenizer: str) -> str:
    """data.tokenizer for a recipe that fine-tunes model.path: the checkpoint's own tokenizer, unless
    data.tokenizer names a tokenizer.json of its own (the default byte tokenizer is replaced)."""
    if data_tokenizer != "byte":
        return data_tokenizer
    spec = hf_tokenizer_spec(resolve_checkpoint_dir(model_path))
    if spec is None:
        raise ValueError(f"model.path={model_path!r} has no {TOKENIZER_FILE} (the fast-tokenizer file dsrecipes reads); "
                         "write one with transformers' AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR), "
                         "or set data.tokenizer=PATH/tokenizer.json")
    return spec
