"""LAMB: Adam moments with a per-tensor trust ratio, the update rule of DeepSpeed's FusedLamb.

Why: LAMB (You et al., 2019, arXiv 1904.00962) scales each tensor's Adam-style update by
||p|| / ||u|| so that every layer moves by a similar relative amount, which keeps large-batch
training stable. DeepSpeed ships it as a CUDA kernel (`FusedLamb`); this is a plain-PyTorch
version with the same arithmetic, usable on any device and checkpointable like torch's optimizers.

Per parameter p with gradient g, at step t (1-based):

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    u = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * p
    r = clamp(||p|| / ||u||, min_coeff, max_coeff), or 1 when ||p|| or ||u|| is 0
    p = p - lr * r * u

Two code paths compute this: a multi-tensor one built on `torch._foreach_*` ops (one kernel
launch per op per device/dtype bucket on CUDA) and a per-tensor loop; they give the same result.
State per parameter: `step` (0-d float tensor), `exp_avg`, `exp_avg_sq`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import torch

from dsrecipes.training.optim.multi_tensor_optimizer import MultiTensorOptimizer

__all__ = ["Lamb"]


def _check_hyperparameters(lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                           max_coeff: float, min_coeff: float) -> None:
    """Raise ValueError on a hyperparameter no LAMB step can use."""
    if not lr > 0.0:
        raise ValueError(f"Lamb: lr={lr} must be > 0")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"Lamb: betas={tuple(betas)} must be two values in [0, 1)")
    if eps < 0.0:
        raise ValueError(f"Lamb: eps={eps} must be >= 0")
    if weight_decay < 0.0:
        raise ValueError(f"Lamb: weight_decay={weight_decay} must be >= 0")
    if min_coeff < 0.0 or min_coeff > max_coeff:
        raise ValueError(f"Lamb: need 0 <= min_coeff <= max_coeff, got min_coeff={min_coeff}, max_coeff={max_coeff}")


class Lamb(MultiTensorOptimizer):
    """Layer-wise Adaptive Moments optimizer (LAMB) with FusedLamb's trust-ratio clamp.

    Args:
        params: parameters or parameter groups (dicts may set their own lr, weight_decay, ...).
        lr: learning rate.
        betas: coefficients of the running averages of the gradient and its square.
        eps: added to the denominator sqrt(v_hat) for numerical stability.
        weight_decay: decoupled weight decay added to the update before the trust ratio.
        max_coeff / min_coeff: bounds of the trust ratio ||p|| / ||u|| (DeepSpeed: 10 and 0.01).
        bias_correction: divide the moments by (1 - beta^t) (DeepSpeed's default, True).
        foreach: True = multi-tensor `torch._foreach_*` path, False = per-tensor loop,
            None = foreach when every parameter of a group is on CUDA.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        max_coeff: float = 10.0,
        min_coeff: float = 0.01,
        bias_correction: bool = True,
        foreach: bool | None = None,
    ):
        _check_hyperparameters(lr, tuple(betas), eps, weight_decay, max_coeff, min_coeff)
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, max_coeff=max_coeff,
            min_coeff=min_coeff, bias_correction=bias_correction, foreach=foreach,
        )
        super().__init__(params, defaults)

    def init_state(self, param: torch.Tensor, state: dict) -> None:
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)

    def update_foreach(self, params, grads, states, group) -> None:
        _lamb_foreach(params, grads, *_state_lists(states), group)

    def update_loop(self, params, grads, states, group) -> None:
        _lamb_loop(params, grads, *_state_lists(states), group)


def _state_lists(states: list[dict]) -> tuple[list, list, list]:
    return [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [s["step"] for s in states]


def _bias_corrections(step: float, beta1: float, beta2: float, enabled: bool) -> tuple[float, float]:
    """(1 - beta1^t, sqrt(1 - beta2^t)), or (1, 1) without bias correction."""
    if not enabled:
        return 1.0, 1.0
    return 1.0 - beta1**step, math.sqrt(1.0 - beta2**step)


def _trust_ratio(p_norm: torch.Tensor, u_norm: torch.Tensor, min_coeff: float, max_coeff: float) -> torch.Tensor:
    """clamp(||p|| / ||u||, min_coeff, max_coeff), and 1 where either norm is 0 (computed on device, no sync)."""
    ratio = (p_norm / u_norm).clamp(min_coeff, max_coeff)
    return torch.where((p_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio))


def lamb_update_(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, bc1: float, bc2_sqrt: float,
                 group: dict) -> torch.Tensor:
    """One tensor's LAMB step in place (moments, then p), given the bias corrections; returns its trust
    ratio (dsrecipes.training.optim.onebit_lamb's warm-up tracks it)."""
    beta1, beta2 = group["betas"]
    m.lerp_(g, 1.0 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
    denom = (v.sqrt() / bc2_sqrt).add_(group["eps"])
    u = (m / bc1).div_(denom)
    if group["weight_decay"] != 0.0:
        u.add_(p, alpha=group["weight_decay"])
    p_norm, u_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(u)
    ratio = _trust_ratio(p_norm, u_norm, group["min_coeff"], group["max_coeff"])
    p.add_(u.mul_(ratio), alpha=-group["lr"])
    return ratio


def _lamb_loop(params, grads, exp_avgs, exp_avg_sqs, steps, group) -> None:
    """Per-tensor LAMB update (the reference path)."""
    beta1, beta2 = group["betas"]
    for p, g, m, v, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        step += 1
        bc1, bc2_sqrt = _bias_corrections(step.item(), beta1, beta2, group["bias_correction"])
        lamb_update_(p, g, m, v, bc1, bc2_sqrt, group)


def _lamb_foreach(params, grads, exp_avgs, exp_avg_sqs, steps, group) -> None:
    """Multi-tensor LAMB update, bucketed by (device, dtype, step) so each foreach call is homogeneous."""
    buckets: dict = defaultdict(list)
    for i, p in enumerate(params):
        steps[i] += 1
        buckets[(p.device, p.dtype, steps[i].item())].append(i)
    beta1, beta2 = group["betas"]
    lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
    for (_, _, step), idx in buckets.items():
        ps = [params[i] for i in idx]
        gs = [grads[i] for i in idx]
        ms = [exp_avgs[i] for i in idx]
        vs = [exp_avg_sqs[i] for i in idx]
        bc1, bc2_sqrt = _bias_corrections(step, beta1, beta2, group["bias_correction"])
        torch._foreach_lerp_(ms, gs, 1.0 - beta1)
        torch._foreach_mul_(vs, beta2)
        torch._foreach_addcmul_(vs, gs, gs, value=1.0 - beta2)
        denoms = torch._foreach_sqrt(vs)
        torch._foreach_div_(denoms, bc2_sqrt)
        torch._foreach_add_(denoms, eps)
        updates = torch._foreach_div(ms, bc1)
        torch._foreach_div_(updates, denoms)
        if wd != 0.0:
            torch._foreach_add_(updates, ps, alpha=wd)
        p_norms = torch.stack(torch._foreach_norm(ps))
        u_norms = torch.stack(torch._foreach_norm(updates))
        ratios = _trust_ratio(p_norms, u_norms, group["min_coeff"], group["max_coeff"])
        torch._foreach_mul_(updates, ratios.unbind())
        torch._foreach_add_(ps, updates, alpha=-lr)
