"""Block-sparse attention as a Trainer extension: applies the recipe's `sparse_attention` group.

Registered at import (dsrecipes.training.trainer imports this module, after kernel_extension, so a
sparse layout takes precedence over flash-attention injection). The transform runs after the model
is built and before the engine wraps or shards it; it only sets `CausalSelfAttention.attention_fn`,
so parameters and checkpoints are the same as the dense model's.
"""

from __future__ import annotations

import logging

from torch import nn

from dsrecipes.models.sparse_attention import apply_sparse_attention
from dsrecipes.training.extensions import Extensions, register_extension

log = logging.getLogger("dsrecipes")


@register_extension
def sparse_attention_extension(cfg) -> Extensions:
    sa_cfg = getattr(cfg, "sparse_attention", None)
    if sa_cfg is None or sa_cfg.mode == "none":
        return Extensions()
    num_heads = cfg.model.n_head

    def transform(model: nn.Module) -> nn.Module:
        count = apply_sparse_attention(model, sa_cfg, num_heads)
        log.info("sparse attention: %s layout, block %d, impl %s, %d attention module(s)",
                 sa_cfg.mode, sa_cfg.block, sa_cfg.impl, count)
        return model

    return Extensions(model_transforms=[transform])
