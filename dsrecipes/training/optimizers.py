"""Optimizer construction: parameter groups (no decay for biases and norms) and torch's fast kernels.

Uses torch's own fused / foreach implementations (`impl=auto` picks fused on CUDA, foreach
otherwise) rather than hand-written ones.
"""

from __future__ import annotations

import torch
from torch import nn

from dsrecipes.training.config import OptimizerConfig

OPTIMIZERS = ("adamw",)
OPTIMIZER_IMPLS = ("auto", "fused", "foreach", "for_loop")


def param_groups(model: nn.Module, weight_decay: float, no_decay_bias_and_norm: bool) -> list[dict]:
    """Two groups: decayed matrices, and undecayed biases / norm weights / other 1-D parameters."""
    decay, no_decay, seen = [], [], set()
    for _, param in model.named_parameters():
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        (no_decay if no_decay_bias_and_norm and param.ndim < 2 else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def _impl_kwargs(impl: str, params: list[torch.Tensor]) -> dict:
    on_cuda = all(p.is_cuda for p in params) and bool(params)
    if impl == "auto":
        impl = "fused" if on_cuda else "foreach"
    if impl == "fused":
        return {"fused": True}
    if impl == "foreach":
        return {"foreach": True}
    return {"foreach": False}


def build_optimizer(cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """The configured optimizer over `model`'s trainable parameters."""
    if cfg.name not in OPTIMIZERS:
        raise ValueError(f"optimizer.name={cfg.name!r} is not valid; choose one of: {', '.join(OPTIMIZERS)}")
    groups = param_groups(model, cfg.weight_decay, cfg.no_decay_bias_and_norm)
    params = [p for g in groups for p in g["params"]]
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, **_impl_kwargs(cfg.impl, params)
    )
