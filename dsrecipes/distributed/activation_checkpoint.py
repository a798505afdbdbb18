"""Activation checkpointing: recompute transformer blocks in the backward instead of storing them.

mode none | full (every block) | every_k (blocks 0, k, 2k, ...); cpu_offload also moves the tensors
the checkpointed blocks do save (their inputs) to CPU memory until the backward needs them.
Applied as a model transform before sharding, by swapping each chosen block's `forward` for a
checkpointed one, so module names and state-dict keys do not change. Uses torch.utils.checkpoint
(non-reentrant), which composes with FSDP2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from dsrecipes.utils.config_enum import ConfigEnum, enum_values
from dsrecipes.utils.inactive_rules import Inactive
from dsrecipes.utils.ranges import POSITIVE_INT, ranged
from dsrecipes.utils.recipe_facts import RecipeFacts

# torch is imported in the functions that use it: the recipe schema imports ActivationCheckpointConfig from
# here, and composing a recipe (`python -m dsrecipes --help`) must not import torch.
if TYPE_CHECKING:
    from torch import nn


class ACMode(ConfigEnum):
    """activation_checkpointing.mode: none, every block (full), or blocks 0, k, 2k, ... (every_k)."""

    none = "none"
    full = "full"
    every_k = "every_k"


AC_MODES = enum_values(ACMode)


@dataclass
class ActivationCheckpointConfig:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, ac: ac.mode == "none", lambda root, path: "activation_checkpointing.mode=none",
                 but=("mode",)),
        Inactive(lambda root, ac: ac.mode == "full", lambda root, path: "activation_checkpointing.mode=full "
                 "checkpoints every block", keys=("every_k",)),
    )

    mode: ACMode = ACMode.none  # none | full | every_k
    every_k: int = ranged(2, POSITIVE_INT)  # with mode=every_k: checkpoint blocks 0, k, 2k, ...
    cpu_offload: bool = False  # keep what checkpointed blocks save on the CPU

    def check(self, facts: RecipeFacts) -> None:
        """The group's own checks (dsrecipes.config.validate walks the groups)."""
        validate_activation_checkpoint_config(self)


def validate_activation_checkpoint_config(cfg: ActivationCheckpointConfig, prefix: str = "activation_checkpointing") -> None:
    if cfg.mode not in AC_MODES:
        raise ValueError(f"{prefix}.mode={cfg.mode!r} is not valid; choose one of: {', '.join(AC_MODES)}")
    if cfg.mode == "every_k" and cfg.every_k < 1:
        raise ValueError(f"{prefix}.every_k={cfg.every_k} must be >= 1")


def _checkpointed(forward, cpu_offload: bool, *args, **kwargs):
    import torch
    from torch.utils.checkpoint import checkpoint

    if cpu_offload:
        with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(model: nn.Module, cfg: ActivationCheckpointConfig) -> int:
    """Checkpoint the chosen members of the model's nn.ModuleLists (its blocks; a Hugging Face model's decoder
    layers, dsrecipes.models.decoder_layers); returns how many."""
    from torch import nn

    from dsrecipes.models.decoder_layers import decoder_layers

    validate_activation_checkpoint_config(cfg)
    if cfg.mode == "none":
        return 0
    step = 1 if cfg.mode == "full" else cfg.every_k
    layers = decoder_layers(model)
    lists = [layers] if layers else [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    count = 0
    for blocks in lists:
        for index, block in enumerate(blocks):
            if index % step == 0:
                block.forward = functools.partial(_checkpointed, block.forward, cfg.cpu_offload)
                count += 1
    return count


def saved_activation_bytes(model: Callable, *inputs, **kwargs) -> int:
    """Bytes autograd keeps for the backward during one forward of `model` (any module or function;
    what checkpointing trims)."""
    import torch

    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs, **kwargs)
    return total
