"""Load a trained dsrecipes model for inference from any of the formats the project writes.

    model, info = load_model("outputs/2026-11-30/12-00-00_gpt")            # a run directory
    model, info = load_model("outputs/.../checkpoints")                     # newest checkpoint (`latest`)
    model, info = load_model("outputs/.../checkpoints/step_600")            # one checkpoint: dcp/ or model.pt
    model, info = load_model("exported/")                                   # safetensors export
    model, info = load_model("hf_checkpoint/")      # a transformers GPT-2 / Llama / Mistral / Qwen2 directory

Checkpoints written at any world size and ZeRO stage are consolidated with
dsrecipes.export.consolidated_model_state (torch.distributed.checkpoint's dcp_to_torch_save for
sharded dcp/ directories; model.pt for full-state ones). The model's shape comes from the checkpoint's
config.yaml, else the run directory's .hydra/config.yaml (vocab_size null there is taken from the
tokenizer as training does), or from config.json of an export or a Hugging Face checkpoint
(dsrecipes.models.hf_import: its tensors renamed, its tokenizer.json used). A caller may pass `model_cfg`
instead: every tensor is then checked against it first, and a mismatch is a ValueError naming the
tensor and both shapes (nothing is loaded).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from dsrecipes.models.config import ModelConfig
from dsrecipes.models.export import CONFIG_FILE, WEIGHTS_FILE
from dsrecipes.models.gpt import GPT
from dsrecipes.models.hf_import import is_hf_checkpoint, read_hf_checkpoint
from dsrecipes.models.hf_tokenizer import resolve_tokenizer
from dsrecipes.models.moe_config import MoEConfig
from dsrecipes.training.checkpointing.checkpoint import COMPLETE_MARKER, LATEST, check_state_dict_matches, resolve_checkpoint_dir


@dataclass
class LoadedFrom:
    kind: str  # "export" | "checkpoint"
    path: Path  # the export directory or the checkpoints/step_N directory
    model_cfg: ModelConfig
    tokenizer: str | None  # "byte" or a tokenizer.json path (None: a Hugging Face checkpoint without tokenizer.json)
    moe_cfg: MoEConfig | None = None  # MoE models: the experts' layout (always loaded at ep_size=1)
    sparse_attention: str | None = None  # the sparse_attention.mode it was trained with (None: dense or unknown)


def _moe_cfg_from(recipe) -> MoEConfig | None:
    if recipe is None or not recipe.get("num_experts"):
        return None
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(MoEConfig), recipe))
    cfg.ep_size = 1  # checkpoints and exports hold every expert
    return cfg


def _model_cfg_from(recipe, tokenizer: str) -> ModelConfig:
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), recipe))
    if cfg.vocab_size is None:
        from dsrecipes.data.tokenizers import build_tokenizer
        from dsrecipes.models.config import padded_vocab_size

        cfg.vocab_size = padded_vocab_size(build_tokenizer(tokenizer).vocab_size)
    return cfg


def resolve_source(path: str | Path) -> tuple[str, Path]:
    """("export", dir) or ("checkpoint", step dir) for a run dir, checkpoints folder, step dir or export."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"generate.checkpoint={str(path)!r} does not exist")
    if is_hf_checkpoint(path) or ((path / WEIGHTS_FILE).exists() and (path / CONFIG_FILE).exists()):
        return "export", path
    if (path / COMPLETE_MARKER).exists() or (path / LATEST).exists():
        return "checkpoint", resolve_checkpoint_dir(path)
    run_config = path / ".hydra" / "config.yaml"
    if run_config.exists():
        dirname = OmegaConf.select(OmegaConf.load(run_config), "checkpoint.dirname", default="checkpoints")
        if (path / dirname / LATEST).exists():
            return "checkpoint", resolve_checkpoint_dir(path / dirname)
        if (path / "export" / WEIGHTS_FILE).exists():
            return "export", path / "export"
    raise FileNotFoundError(
        f"generate.checkpoint={str(path)!r} is not a dsrecipes run directory, checkpoints folder, checkpoint "
        f"(with {COMPLETE_MARKER}), safetensors export (with {WEIGHTS_FILE} and {CONFIG_FILE}) or Hugging Face "
        "checkpoint directory"
    )


def _checkpoint_recipe(step_dir: Path):
    for candidate in (step_dir / "config.yaml", step_dir.parent.parent / ".hydra" / "config.yaml"):
        if candidate.exists():
            return OmegaConf.load(candidate)
    raise FileNotFoundError(f"checkpoint {step_dir} has no config.yaml and no run directory .hydra/config.yaml "
                            "beside it: the model's shape is unknown; pass model_cfg")


def read_source(path: str | Path) -> tuple[LoadedFrom, dict]:
    """(where and what, the full-precision state dict) without building a model."""
    kind, where = resolve_source(path)
    if kind == "export" and is_hf_checkpoint(where):  # the HF layout: dsrecipes' export or a transformers checkpoint
        model_cfg, state, view = read_hf_checkpoint(where)
        sparse = (view.get("sparse_attention") or {}).get("mode")
        return LoadedFrom(kind, where, model_cfg, view["tokenizer"], None, sparse), state
    if kind == "export":
        from safetensors import safe_open
        from safetensors.torch import load_file

        config = json.loads((where / CONFIG_FILE).read_text())
        tokenizer = resolve_tokenizer(config.get("tokenizer", "byte"), where)
        state = load_file(str(where / WEIGHTS_FILE))
        with safe_open(str(where / WEIGHTS_FILE), framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
        for alias, owner in aliases.items():
            state[alias] = state[owner]
        model_cfg = ModelConfig(**config["model"])
        sparse = (config.get("sparse_attention") or {}).get("mode")
        return LoadedFrom(kind, where, model_cfg, tokenizer, _moe_cfg_from(config.get("moe")), sparse), state
    from dsrecipes.export import consolidated_model_state

    recipe = _checkpoint_recipe(where)
    tokenizer = OmegaConf.select(recipe, "data.tokenizer", default="byte")
    model_cfg = _model_cfg_from(recipe.model, tokenizer)
    moe_cfg = _moe_cfg_from(OmegaConf.select(recipe, "moe", default=None))
    sparse = OmegaConf.select(recipe, "sparse_attention.mode", default=None)
    sparse = None if sparse in (None, "none") else str(sparse)
    return LoadedFrom(kind, where, model_cfg, tokenizer, moe_cfg, sparse), consolidated_model_state(where)


# Fields that change what the weights mean (a head count changes no tensor shape, so shapes alone miss it).
SHAPE_FIELDS = ("style", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "vocab_size", "bias", "qkv_bias",
                "tie_embeddings")


def check_config_matches(stored: ModelConfig, given: ModelConfig, source: Path) -> None:
    """ValueError naming every model.<key> where `given` differs from the config the weights were trained with."""
    diffs = [f"model.{k}={getattr(given, k)!r} (checkpoint: {getattr(stored, k)!r})" for k in SHAPE_FIELDS
             if getattr(given, k) != getattr(stored, k) and not (k == "d_ff" and given.ffn_dim == stored.ffn_dim)
             and not (k == "n_kv_head" and given.kv_heads == stored.kv_heads)
             and not (k == "qkv_bias" and given.attn_qkv_bias == stored.attn_qkv_bias)]
    if diffs:
        raise ValueError(f"the model config does not match checkpoint {source}: {'; '.join(diffs)}; "
                         "drop the model overrides to use the checkpoint's own config")


def load_model(path: str | Path, model_cfg: ModelConfig | None = None,
               device: str | torch.device = "cpu") -> tuple[GPT, LoadedFrom]:
    """A GPT in eval mode with the weights of `path` (see the module docstring), on `device`, fp32."""
    info, state = read_source(path)
    if model_cfg is not None:
        check_config_matches(info.model_cfg, model_cfg, info.path)
        info = dataclasses.replace(info, model_cfg=model_cfg)
    with torch.device("meta"):
        model = GPT(info.model_cfg, moe=info.moe_cfg)
    expected = model.state_dict()
    check_state_dict_matches(expected, state, info.path)
    model = model.to_empty(device=device)
    model.load_state_dict({k: v.to(device) for k, v in state.items()})
    if model.cfg.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight
    model.init_rope()
    return model.eval(), info
