"""Activation checkpointing as a Trainer extension: applies the recipe's `activation_checkpointing` group.

Registered at import (dsrecipes.training.trainer imports this module); the transform runs after the
model is built and before the engine shards it.
"""

from __future__ import annotations

import logging

from torch import nn

from dsrecipes.distributed.activation_checkpoint import apply_activation_checkpointing
from dsrecipes.training.extensions import Extensions, register_extension

log = logging.getLogger("dsrecipes")


@register_extension
def activation_checkpoint_extension(cfg) -> Extensions:
    ac_cfg = getattr(cfg, "activation_checkpointing", None)
    if ac_cfg is None or ac_cfg.mode == "none":
        return Extensions()

    def transform(model: nn.Module) -> nn.Module:
        count = apply_activation_checkpointing(model, ac_cfg)
        log.info("activation checkpointing: %s, %d block(s)%s", ac_cfg.mode, count, ", saved tensors on CPU" if ac_cfg.cpu_offload else "")
        return model

    return Extensions(model_transforms=[transform])
