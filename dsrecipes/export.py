"""Consolidate a checkpoint into one safetensors file usable without any distributed setup.

    python -m dsrecipes.export outputs/2026-11-30/12-00-00_gpt_zero3/checkpoints/step_300 exported/
    python -m dsrecipes.export outputs/.../checkpoints exported/          # the `latest` checkpoint

DeepSpeed's zero_to_fp32 use case: works offline (one process, no GPU) on a sharded dcp/ checkpoint
written at any world size and ZeRO stage, or on a full-state one; writes the Hugging Face layout
(dsrecipes.models.hf_export: model.safetensors, config.json, generation_config.json, the tokenizer),
readable by `dsrecipes.models.load_exported` and by transformers' AutoModelForCausalLM.from_pretrained
(MoE models: dsrecipes' own layout).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf
from safetensors import safe_open

from dsrecipes.models import ModelConfig
from dsrecipes.models.export import CONFIG_FILE, WEIGHTS_FILE
from dsrecipes.models.hf_config import is_hf_config
from dsrecipes.models.hf_export import export_model
from dsrecipes.models.moe_config import MoEConfig
from dsrecipes.training.checkpointing.checkpoint import read_checkpoint, resolve_checkpoint_dir

DCP_DIR = "dcp"


def consolidated_model_state(checkpoint: Path) -> dict:
    """Full-precision model weights of a checkpoint directory, whatever wrote it."""
    if (checkpoint / DCP_DIR).exists():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(str(checkpoint / DCP_DIR), f"{tmp}/full.pt")
            return torch.load(f"{tmp}/full.pt", weights_only=False)["model"]
    return read_checkpoint(checkpoint, "model.pt")


def export_checkpoint(checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the export of a dsrecipes checkpoint (or the newest of a folder of them) to out_dir; returns the weights file."""
    checkpoint = resolve_checkpoint_dir(checkpoint_dir)
    config_file = checkpoint / "config.yaml"
    if not config_file.exists():
        raise FileNotFoundError(f"{checkpoint} has no config.yaml: the model's shape is unknown")
    recipe = OmegaConf.load(config_file)
    model_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), recipe.model))
    state = consolidated_model_state(checkpoint)
    tokenizer = OmegaConf.select(recipe, "data.tokenizer", default="byte")
    moe = OmegaConf.select(recipe, "moe", default=None)
    moe_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(MoEConfig), moe)) if moe else None
    return export_model(state, model_cfg, out_dir, tokenizer=tokenizer, extra={"source": str(checkpoint)},
                        moe_cfg=moe_cfg)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoints/step_N directory, or the checkpoints folder (uses latest)")
    parser.add_argument("out_dir")
    args = parser.parse_args(argv)
    weights = export_checkpoint(args.checkpoint, args.out_dir)
    print("\n".join(describe_export(weights.parent)))


def describe_export(out_dir: Path) -> list[str]:
    """What an export directory holds, for the command's output: the layout, parameters, every file and its size."""
    config = json.loads((out_dir / CONFIG_FILE).read_text())
    layout = (f"Hugging Face layout (model_type {config['model_type']}: AutoModelForCausalLM.from_pretrained loads it)"
              if is_hf_config(config) else "dsrecipes layout (dsrecipes.models.load_exported loads it)")
    with safe_open(str(out_dir / WEIGHTS_FILE), framework="pt") as f:
        parameters = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    lines = [f"exported to {out_dir}: {layout}, {parameters:,} stored parameters"]
    for path in sorted(p for p in out_dir.rglob("*") if p.is_file()):
        lines.append(f"  {path.relative_to(out_dir)}  {path.stat().st_size:,} bytes")
    return lines


if __name__ == "__main__":
    main()
