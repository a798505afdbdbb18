"""Lion (EvoLved Sign Momentum), the optimizer behind DeepSpeed's FusedLion / DeepSpeedCPULion.

Why: Lion (Chen et al., 2023, arXiv 2302.06675) keeps a single momentum buffer (half of Adam's
optimizer memory) and moves every weight by exactly +-lr per step, the sign of an interpolation
between momentum and gradient. DeepSpeed offers it as a CUDA / CPU kernel; this is a plain-PyTorch
version with the same arithmetic, checkpointable like torch's optimizers.

Per parameter p with gradient g:

    c = beta1 * m + (1 - beta1) * g
    p = p * (1 - lr * weight_decay) - lr * sign(c)
    m = beta2 * m + (1 - beta2) * g

Because every step has magnitude lr, Lion wants a learning rate 3-10x smaller than AdamW's and a
weight decay 3-10x larger (so that lr * weight_decay, the effective decay, stays similar).
A multi-tensor path (`torch._foreach_*`) and a per-tensor loop compute the same result.
State per parameter: `exp_avg`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch

from dsrecipes.training.optim.multi_tensor_optimizer import MultiTensorOptimizer

__all__ = ["Lion"]


class Lion(MultiTensorOptimizer):
    """Sign-momentum optimizer with decoupled weight decay.

    Args:
        params: parameters or parameter groups (dicts may set their own lr, weight_decay, ...).
        lr: learning rate (the size of every element's step).
        betas: (beta1, beta2): beta1 interpolates momentum and gradient for the update's sign,
            beta2 is the momentum's decay.
        weight_decay: decoupled weight decay; parameters shrink by a factor (1 - lr * weight_decay).
        foreach: True = multi-tensor `torch._foreach_*` path, False = per-tensor loop,
            None = foreach when every parameter of a group is on CUDA.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        foreach: bool | None = None,
    ):
        if not lr > 0.0:
            raise ValueError(f"Lion: lr={lr} must be > 0")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Lion: betas={tuple(betas)} must be two values in [0, 1)")
        if weight_decay < 0.0:
            raise ValueError(f"Lion: weight_decay={weight_decay} must be >= 0")
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, foreach=foreach)
        super().__init__(params, defaults)

    def init_state(self, param: torch.Tensor, state: dict) -> None:
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)

    def update_foreach(self, params, grads, states, group) -> None:
        _lion_foreach(params, grads, [s["exp_avg"] for s in states], group)

    def update_loop(self, params, grads, states, group) -> None:
        _lion_loop(params, grads, [s["exp_avg"] for s in states], group)


def _lion_loop(params, grads, exp_avgs, group) -> None:
    """Per-tensor Lion update (the reference path)."""
    beta1, beta2 = group["betas"]
    lr, wd = group["lr"], group["weight_decay"]
    for p, g, m in zip(params, grads, exp_avgs):
        direction = m.lerp(g, 1.0 - beta1).sign_()
        if wd != 0.0:
            p.mul_(1.0 - lr * wd)
        p.add_(direction, alpha=-lr)
        m.lerp_(g, 1.0 - beta2)


def _lion_foreach(params, grads, exp_avgs, group) -> None:
    """Multi-tensor Lion update, bucketed by (device, dtype) so each foreach call is homogeneous."""
    buckets: dict = defaultdict(list)
    for i, p in enumerate(params):
        buckets[(p.device, p.dtype)].append(i)
    beta1, beta2 = group["betas"]
    lr, wd = group["lr"], group["weight_decay"]
    for idx in buckets.values():
        ps = [params[i] for i in idx]
        gs = [grads[i] for i in idx]
        ms = [exp_avgs[i] for i in idx]
        directions = torch._foreach_lerp(ms, gs, 1.0 - beta1)
        torch._foreach_sign_(directions)
        if wd != 0.0:
            torch._foreach_mul_(ps, 1.0 - lr * wd)
        torch._foreach_add_(ps, directions, alpha=-lr)
        torch._foreach_lerp_(ms, gs, 1.0 - beta2)
