"""1-bit LAMB (DeepSpeed's OnebitLamb, arXiv 2104.06069): LAMB whose momentum is averaged with 1-bit
communication after a warm-up, with frozen trust coefficients scaled by a bounded factor.

    optimizer=onebitlamb optimizer.freeze_step=100 launcher.nproc_per_node=2    # the recipe option

Per parameter p at step t (1-based); lr, betas (b1, b2), eps, wd:

* warm-up, t <= freeze_step: LAMB on the averaged gradient, the update of dsrecipes.training.lamb.Lamb
  (u = (m / c1) / (sqrt(v) / c2 + eps) + wd p, r = clamp(||p|| / ||u||, min_coeff, max_coeff),
  p -= lr r u), while tracking each tensor's coefficient: coeff = coeff_beta coeff + (1 - coeff_beta) r
  (from 0, r = 1 left out, as DeepSpeed). At t = freeze_step v is copied to v_fresh.
* compression, t > freeze_step: v frozen; each rank updates m with its own gradient; every
  tensor's m is multiplied by a scaling coefficient (fixed at the first compressed step: the mean
  over tensors of ||m|| / sqrt(numel) divided by the tensor's own, so that all tensors have similar
  magnitudes), all momenta are averaged together as one flat 1-bit compressed all-reduce, then
  divided back and masked (exp_avg_mask). The gradient is reconstructed from the averaged momentum,
  g' = (m - b1 m_prev) / (1 - b1), and v_fresh = b2 v_fresh + (1 - b2) g'^2. With d = sqrt(v) / c2 + eps
  and d' = sqrt(v_fresh) / c2 + eps, u = (m / c1) / d + wd p and the factor
      f = max(d / d')   (with weight decay: f r' + 1 - r', r' = min(1, ||u - wd p|| / ||u||))
  clamped to [factor_min, factor_max] and to within factor_threshold of the previous step's factor
  (relative); p -= lr coeff f u.

c1 = 1 - b1^t, c2 = sqrt(1 - b2^freeze) with bias_correction, else 1 (DeepSpeed's update, the default:
its OnebitLamb takes bias_correction but never applies it). So with bias_correction=false the
warm-up equals Lamb(bias_correction=False) exactly. See dsrecipes.training.onebit_base for the
process group, masks and checkpoints (errors reset on reload; the scaling coefficients are saved).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from dsrecipes.training.lamb import lamb_update_
from dsrecipes.training.onebit_base import OneBitOptimizer, check_onebit_hyperparameters

__all__ = ["OneBitLamb"]


class OneBitLamb(OneBitOptimizer):
    """1-bit LAMB.

    Args:
        params: parameters or parameter groups (a group may hold `exp_avg_mask`).
        lr, betas, eps, weight_decay, max_coeff, min_coeff: LAMB's (DeepSpeed's FusedLamb).
        freeze_step: uncompressed warm-up updates (>= 1; DeepSpeed's default 100000).
        coeff_beta: the running average of the trust coefficients during the warm-up (0.9).
        factor_max, factor_min, factor_threshold: bounds of the scaling factor (4.0, 0.5) and its
            largest relative change per step (0.1).
        bias_correction: bias correction of the moments (false = DeepSpeed's update).
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, freeze_step: int = 100000, max_coeff: float = 10.0,
                 min_coeff: float = 0.01, coeff_beta: float = 0.9, factor_max: float = 4.0, factor_min: float = 0.5,
                 factor_threshold: float = 0.1, bias_correction: bool = False):
        check_onebit_hyperparameters("OneBitLamb", lr, betas, eps, weight_decay, freeze_step=freeze_step)
        if not 0 <= min_coeff <= max_coeff:
            raise ValueError(f"OneBitLamb: need 0 <= min_coeff <= max_coeff, got {min_coeff}, {max_coeff}")
        if not 0 < factor_min <= factor_max or not 0 <= factor_threshold < 1 or not 0 <= coeff_beta < 1:
            raise ValueError(f"OneBitLamb: need 0 < factor_min <= factor_max, 0 <= factor_threshold < 1 and "
                             f"0 <= coeff_beta < 1; got factor_min={factor_min}, factor_max={factor_max}, "
                             f"factor_threshold={factor_threshold}, coeff_beta={coeff_beta}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, max_coeff=max_coeff,
                        min_coeff=min_coeff, bias_correction=bias_correction)
        super().__init__(params, defaults)
        self.freeze_step = freeze_step
        self.coeff_beta = coeff_beta
        self.factor_max, self.factor_min, self.factor_threshold = factor_max, factor_min, factor_threshold

    def init_state(self, p: torch.Tensor, state: dict) -> None:
        super().init_state(p, state)
        state["lamb_coeff_freeze"] = 0.0
        state["last_factor"] = 1.0

    def needs_gradient_allreduce(self) -> bool:
        return self.steps_taken() + 1 <= self.freeze_step

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        loss = self.closure_loss(closure)
        t = self.steps_taken() + 1
        if t <= self.freeze_step:
            self._warmup_step(t)
        else:
            self._compressed_step(t)
        return loss

    # ------------------------------------------------------------------ warm-up: LAMB
    def _warmup_step(self, t: int) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            bc1, bc2_sqrt = self.bias_corrections(t, beta1, beta2, group["bias_correction"])
            for p, state in self.params_to_step(group):
                v = state["exp_avg_sq"]
                ratio = lamb_update_(p, p.grad, state["exp_avg"], v, bc1, bc2_sqrt, group)
                coeff = float(ratio)
                if coeff != 1.0:
                    state["lamb_coeff_freeze"] = self.coeff_beta * state["lamb_coeff_freeze"] + (1 - self.coeff_beta) * coeff
                if t == self.freeze_step:
                    state["exp_avg_sq_fresh"] = v.clone()

    # ------------------------------------------------------------------ compression stage
    def _entries(self) -> list[tuple[dict, torch.Tensor, dict]]:
        """(group, parameter, state) of every parameter with state, in a fixed order (the flat buffer's)."""
        return [(g, p, self.state[p]) for g in self.param_groups for p in g["params"] if self.state.get(p)]

    @staticmethod
    def _set_scaling_coefficients(entries) -> None:
        scales = [float(torch.linalg.vector_norm(s["exp_avg"])) / math.sqrt(s["exp_avg"].numel()) for _, _, s in entries]
        united = sum(scales) / len(scales)
        for (_, _, state), scale in zip(entries, scales):
            state["scaling_coeff"] = united / scale if scale > 0 else 1.0

    def _compressed_step(self, t: int) -> None:
        entries = self._entries()
        if not entries:
            return
        if any("scaling_coeff" not in s for _, _, s in entries):
            self._set_scaling_coefficients(entries)
        previous = [s["exp_avg"].clone() for _, _, s in entries]
        for group, p, state in entries:
            if p.grad is not None:
                if p.grad.is_sparse:
                    raise RuntimeError("OneBitLamb does not support sparse gradients")
                state["exp_avg"].lerp_(p.grad, 1.0 - group["betas"][0])
            state["step"] += 1
        flat = torch.cat([(s["exp_avg"] * s["scaling_coeff"]).reshape(-1) for _, _, s in entries])
        self.compress_(flat, "flat")
        for (group, p, state), chunk, m_prev in zip(entries, flat.split([s["exp_avg"].numel() for _, _, s in entries]),
                                                    previous):
            m = state["exp_avg"]
            m.copy_(chunk.view_as(m)).div_(state["scaling_coeff"])
            self.apply_mask_(group, m)
            self._update(group, p, state, m_prev, t)

    def _update(self, group: dict, p: torch.Tensor, state: dict, m_prev: torch.Tensor, t: int) -> None:
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        fresh = state.setdefault("exp_avg_sq_fresh", v.clone())
        reconstructed = (m - m_prev * beta1) / (1 - beta1)
        fresh.mul_(beta2).addcmul_(reconstructed, reconstructed, value=1 - beta2)
        bc1, _ = self.bias_corrections(t, beta1, beta2, group["bias_correction"])
        _, bc2_sqrt = self.bias_corrections(self.freeze_step, beta1, beta2, group["bias_correction"])
        denom = (v.sqrt() / bc2_sqrt).add_(eps)
        prelim = (m / bc1).div_(denom)
        update = prelim + wd * p if wd > 0.0 else prelim
        factor = float((denom / (fresh.sqrt() / bc2_sqrt).add_(eps)).max())
        if wd > 0.0:
            update_norm = float(torch.linalg.vector_norm(update))
            ratio = min(1.0, float(torch.linalg.vector_norm(prelim)) / update_norm) if update_norm > 0 else 1.0
            factor = factor * ratio + (1.0 - ratio)
        factor = min(max(factor, self.factor_min), self.factor_max)
        last = state["last_factor"]
        factor = min(max(factor, last * (1.0 - self.factor_threshold)), last * (1.0 + self.factor_threshold))
        state["last_factor"] = factor
        p.add_(update, alpha=-lr * state["lamb_coeff_freeze"] * factor)
