"""What the autotuner reads from the recipe it tunes: model shape and precision for the memory estimate,
FLOPs per token for the flops metric, the device the trials run on and its memory (the default cap).

The model is built on the meta device (instant, allocates nothing), as dsrecipes.estimate does.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import torch

from dsrecipes.profiling.autotuning.pruning import RecipeMemory

CAP_FRACTION = 0.9  # of the device's memory: the rest for the CUDA context, communication buffers, fragmentation


@dataclass(frozen=True)
class RecipeFacts:
    memory: RecipeMemory
    flops_per_token: float
    checkpointing: bool  # the recipe's own activation checkpointing is full (kept when fast=true)
    device: str  # cuda | cpu: where the trials train


def recipe_facts(root) -> RecipeFacts:
    """The facts of a validated recipe (a RootConfig object, as validate_recipe returns it)."""
    from dsrecipes.data.tokenizers import build_tokenizer
    from dsrecipes.models import GPT
    from dsrecipes.models.config import padded_vocab_size
    from dsrecipes.training.precision import steps_bf16_masters

    model_cfg = copy.deepcopy(root.model)
    if model_cfg.vocab_size is None:
        model_cfg.vocab_size = padded_vocab_size(build_tokenizer(str(root.data.tokenizer)).vocab_size)
    with torch.device("meta"):
        gpt = GPT(model_cfg, root.moe)
    seq_len = int(root.data.block_size)
    memory = RecipeMemory(
        num_params=gpt.num_params(), n_layer=model_cfg.n_layer, d_model=model_cfg.d_model, ffn_dim=model_cfg.ffn_dim,
        vocab_size=model_cfg.vocab_size, seq_len=seq_len, style=str(model_cfg.style), precision=str(root.precision.dtype),
        master_weights=bool(root.precision.master_weights), optimizer=str(root.optimizer.name),
        momentum=float(getattr(root.optimizer, "momentum", 0.0) or 0.0),
        bf16_masters=steps_bf16_masters(root.precision), tp=root.parallel.tp, pp=root.parallel.pp, sp=root.parallel.sp)
    return RecipeFacts(memory, gpt.flops_per_token(seq_len), str(root.activation_checkpointing.mode) == "full",
                       trial_device(str(root.trainer.device)))


def trial_device(setting: str) -> str:
    """trainer.device as the trials will see it: auto is cuda when present."""
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if setting.startswith("cuda") else "cpu"


def machine_memory_bytes() -> int:
    """Physical RAM of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_cap_bytes(device: str, local_world_size: int) -> float:
    """90% of one rank's memory: a GPU's total memory, or the RAM shared by the ranks on this node."""
    if device == "cuda" and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
    else:
        total = machine_memory_bytes() / max(local_world_size, 1)
    return CAP_FRACTION * total
