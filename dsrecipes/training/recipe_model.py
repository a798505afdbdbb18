"""The recipe's model for this rank: dsrecipes' GPT from scratch, or a Hugging Face checkpoint either way it runs.

    built = build_recipe_model(cfg.model, cfg.moe, dims, cfg.parallel, device)
    engine = build_engine(built.module, ..., materialize=built.materialize, model_description=built.description)

* no model.path: dsrecipes.distributed.pipeline_parallel.build_gpt_for_rank (the whole GPT, or this pipeline
  rank's stages), initialised as one process's;
* model.path, native (style gpt2 / llama): dsrecipes' GPT built on the meta device, filled from the checkpoint by
  dsrecipes.models.hf_loading once parallelize has sharded it (under pipeline parallelism: loaded whole, then
  the stages kept);
* model.path, transformers (style hf): the Hugging Face module (dsrecipes.models.hf_module) on the meta device,
  filled the same way.
`description` is the layout line's model part: which way the checkpoint runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dsrecipes.distributed.pipeline_parallel import build_gpt_for_rank
from dsrecipes.models.gpt import GPT
from dsrecipes.models.hf_import import gpt_from_hf, refuse_moe_on_checkpoint


@dataclass
class RecipeModel:
    module: nn.Module
    materialize: Callable[[nn.Module, torch.device], None] | None = None
    description: str | None = None


def _native_description(model_cfg) -> str:
    from dsrecipes.models.hf_config import model_type_of, read_hf_config, resolve_checkpoint_dir

    config = read_hf_config(resolve_checkpoint_dir(model_cfg.path))
    extras = [f"head_dim {model_cfg.d_head}" if model_cfg.d_head else "", "q/k norms" if model_cfg.qk_norm else "",
              f"rope {model_cfg.rope_type}" if str(model_cfg.rope_type) != "default" else ""]
    extra = "".join(f", {e}" for e in extras if e)
    return f"native dsrecipes {model_cfg.style} blocks from {model_type_of(config, model_cfg.path)}{extra}"


def build_recipe_model(model_cfg, moe_cfg, dims, parallel_cfg, device: torch.device) -> RecipeModel:
    """This rank's model (see the module docstring)."""
    from dsrecipes.models.hf_loading import checkpoint_loader

    if not model_cfg.path:
        return RecipeModel(build_gpt_for_rank(model_cfg, moe_cfg, dims, parallel_cfg, device))
    if model_cfg.runs_transformers:
        from dsrecipes.models.hf_module import build_hf_module

        module = build_hf_module(model_cfg)
        return RecipeModel(module, checkpoint_loader(module, model_cfg), module.describe())
    description = _native_description(model_cfg)
    if dims.pp > 1:  # the stages come from the whole model
        return RecipeModel(gpt_from_hf(model_cfg, device, moe=moe_cfg), description=description)
    refuse_moe_on_checkpoint(model_cfg, moe_cfg)
    with torch.device("meta"):
        gpt = GPT(model_cfg)
    return RecipeModel(gpt, checkpoint_loader(gpt, model_cfg), description)

