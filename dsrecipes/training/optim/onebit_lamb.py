"""1-bit LAMB (DeepSpeed's OnebitLamb, arXiv 2104.06069): LAMB whose momentum is averaged with 1-bit
communication after a warm-up, with frozen trust coefficients scaled by a bounded factor.

    optimizer=onebitlamb optimizer.freeze_step=100 launcher.nproc_per_node=2    # the recipe option

Per parameter p at step t (1-based); lr, betas (b1, b2), eps, wd:

* warm-up, t <= freeze_step: LAMB on the averaged gradient, the update of dsrecipes.training.optim.lamb.Lamb
  (u = (m / c1) / (sqrt(v) / c2 + eps) + wd p, r = clamp(||p|| / ||u||, min_coeff, max_coeff),
  p -= lr r u), while tracking each tensor's coefficient: coeff = coeff_beta coeff + (1 - coeff_beta) r
  (from 0, r = 1 left out, as DeepSpeed). At t = freeze_step v is copied to v_fresh.
* compression, t > freeze_step: v frozen; each rank updates m with its own gradient; every
  tensor's m is multiplied by a scaling coefficient (the mean over tensors of rms(m) = ||m|| / sqrt(numel)
  divided by the tensor's own, so that all tensors have similar magnitudes; see "Scaling coefficients"
  below), all momenta are averaged together as one flat 1-bit compressed all-reduce, then
  divided back and masked (exp_avg_mask). The gradient is reconstructed from the averaged momentum,
  g' = (m - b1 m_prev) / (1 - b1), and v_fresh = b2 v_fresh + (1 - b2) g'^2. With d = sqrt(v) / c2 + eps
  and d' = sqrt(v_fresh) / c2 + eps, u = (m / c1) / d + wd p and the factor
      f = max(d / d')   (with weight decay: f r' + 1 - r', r' = min(1, ||u - wd p|| / ||u||))
  clamped to [factor_min, factor_max] and to within factor_threshold of the previous step's factor
  (relative); p -= lr coeff f u.

c1 = 1 - b1^t, c2 = sqrt(1 - b2^freeze) with bias_correction, else 1 (DeepSpeed's update, the default:
its OnebitLamb takes bias_correction but never applies it). So with bias_correction=false the
warm-up equals Lamb(bias_correction=False) exactly. See dsrecipes.training.optim.onebit_base for the
process group, masks and checkpoints (errors reset on reload; the scaling coefficients are saved).

Scaling coefficients, a deliberate difference from DeepSpeed (issue 39): the fused buffer has one 1-bit
scale per rank (worker stage) and per chunk (server stage), so the coefficients only work while they keep
every tensor's scaled momentum of similar size. DeepSpeed computes them once, from the warm-up momentum at
the first compressed step, and keeps them; that assumes the tensors' relative momentum sizes no longer
change. They do change after an early freeze: in model=gpt_debug with freeze_step=10 the attention
projections whose gradients start near zero have an rms(m) ~500-1500x below the mean at the freeze and
coefficients ~500-1500 to match; their momenta then grow, and by step 20 one of them held 82% of the
fused buffer's squared norm. The one scale followed it, every other tensor received entries of +-scale /
its coefficient, far above its own momentum; the momentum recursion carried that noise forward (the
scaled momentum grew 40x in 30 steps), the averaged momentum ended anti-correlated with the exact average
(cosine -0.9), v_fresh filled with reconstructed noise (the factor sank to factor_min) and the loss spiked:
val loss 3.43-3.90 after 40 steps at world 2 against 3.02-3.04 for the uncompressed twin (3.15-3.20 with
the coefficients refreshed). Here (refresh_scaling=True, the default) the
coefficients are recomputed at every compressed step from the momenta about to be compressed, the ranks
agreeing through one all-reduce of one fp32 value per tensor (a few hundred bytes beside the 1-bit
payload), and the compression errors, kept in scaled units, are rescaled by new / old coefficient so
error feedback carries on in the new units. refresh_scaling=False is DeepSpeed's (fixed at the first
compressed step, from the warm-up momentum); in a recipe, optimizer.refresh_scaling=false.

Which DeepSpeed: the algorithm of DeepSpeed <= 0.19.6 (deepspeed/runtime/fp16/onebit/lamb.py with the compressed
all-reduce of deepspeed/runtime/comm/nccl.py); DeepSpeed 0.19.7 removed its 1-bit optimizers (PR #8490), and
0.19.7+ refuses a config with "type": "OneBitLamb". Tested against a numpy re-statement of 0.19.6's step(), step
by step at two simulated ranks past the freeze, with refresh_scaling=False (DeepSpeed's coefficients) and True
(tests/unit/test_onebit_algorithms.py). Also unlike DeepSpeed: its fused momentum buffer keeps the previous
compressed result in its padding entries and feeds them into the next compression; here the padding is zeros
every call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from dsrecipes.training.optim.lamb import lamb_update_
from dsrecipes.training.optim.onebit_base import OneBitOptimizer, check_onebit_hyperparameters

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
        refresh_scaling: recompute the momentum scaling coefficients at every compressed step (True, see
            the module docstring) or keep those of the first compressed step (False, DeepSpeed's).
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, freeze_step: int = 100000, max_coeff: float = 10.0,
                 min_coeff: float = 0.01, coeff_beta: float = 0.9, factor_max: float = 4.0, factor_min: float = 0.5,
                 factor_threshold: float = 0.1, bias_correction: bool = False, refresh_scaling: bool = True):
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
        self.refresh_scaling = refresh_scaling

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
    def _coefficients(scales: list[float]) -> list[float]:
        """DeepSpeed's scaling coefficients from each tensor's rms(m): their mean / the tensor's own (1 for 0)."""
        united = sum(scales) / len(scales)
        return [united / scale if scale > 0 else 1.0 for scale in scales]

    @classmethod
    def _set_scaling_coefficients(cls, entries) -> None:
        """DeepSpeed's: from this rank's momenta (the warm-up's, the same on every rank), once."""
        scales = [float(torch.linalg.vector_norm(s["exp_avg"])) / math.sqrt(s["exp_avg"].numel()) for _, _, s in entries]
        for (_, _, state), coeff in zip(entries, cls._coefficients(scales)):
            state["scaling_coeff"] = coeff

    def _refresh_scaling_coefficients(self, entries) -> None:
        """The coefficients of the momenta about to be compressed: rms(m) per tensor averaged (as mean
        squares) over the ranks by one small all-reduce, so that every rank scales alike; the compression
        errors (in scaled units) rescaled from the old coefficients to the new."""
        momenta = [s["exp_avg"] for _, _, s in entries]
        mean_squares = torch.stack([torch.linalg.vector_norm(m, dtype=torch.float32).square() / m.numel()
                                    for m in momenta])
        if self.world_size > 1:
            dist.all_reduce(mean_squares, group=self.process_group)
            mean_squares /= self.world_size
        coefficients = self._coefficients(mean_squares.sqrt().tolist())
        old = [s.get("scaling_coeff") for _, _, s in entries]
        errors = self.compression_errors.get("flat")
        if errors is not None and None not in old and coefficients != old:
            ratios = torch.tensor([new / was for new, was in zip(coefficients, old)], dtype=errors.worker.dtype,
                                  device=errors.worker.device)
            sizes = torch.tensor([m.numel() for m in momenta], device=errors.worker.device)
            per_entry = torch.repeat_interleave(ratios, sizes)
            errors.worker[:per_entry.numel()].mul_(per_entry)  # the padding's errors stay as they are
            chunk = errors.server.numel()  # this rank's server chunk of the (padded) flat buffer
            start = chunk * (dist.get_rank(self.process_group) if self.world_size > 1 else 0)
            mine = per_entry[start:start + chunk]
            errors.server[:mine.numel()].mul_(mine)
        for (_, _, state), coeff in zip(entries, coefficients):
            state["scaling_coeff"] = coeff

    def _compressed_step(self, t: int) -> None:
        entries = self._entries()
        if not entries:
            return
        if not self.refresh_scaling and any("scaling_coeff" not in s for _, _, s in entries):
            self._set_scaling_coefficients(entries)
        previous = [s["exp_avg"].clone() for _, _, s in entries]
        for group, p, state in entries:
            if p.grad is not None:
                if p.grad.is_sparse:
                    raise RuntimeError("OneBitLamb does not support sparse gradients")
                state["exp_avg"].lerp_(p.grad, 1.0 - group["betas"][0])
            state["step"] += 1
        if self.refresh_scaling:
            self._refresh_scaling_coefficients(entries)
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
