"""1-bit Adam (DeepSpeed's OnebitAdam, arXiv 2102.02888): Adam whose momentum is averaged with 1-bit
error-compensated communication once the variance has stabilised.

The algorithm of DeepSpeed <= 0.19.6 (deepspeed/runtime/fp16/onebit/adam.py with the compressed
all-reduce of deepspeed/runtime/comm/nccl.py); DeepSpeed 0.19.7 removed its 1-bit optimizers (PR #8490),
and 0.19.7+ refuses a config with "type": "OneBitAdam". Tested against a numpy re-statement of 0.19.6's
step(), step by step at two simulated ranks past the freeze (tests/unit/test_onebit_algorithms.py).

    optimizer=onebitadam optimizer.freeze_step=100 launcher.nproc_per_node=2    # the recipe option

Per parameter p, at step t (1-based), lr, betas (b1, b2), eps, weight decay wd:

* warm-up, t <= freeze_step: Adam on the gradient g averaged over the data-parallel ranks (the
  strategy all-reduces it as DDP does):
      m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
      p = p (1 - lr wd) - lr (m / c1) / (sqrt(v) / c2 + eps)
  with c1 = 1 - b1^t, c2 = sqrt(1 - b2^t) when bias_correction, else c1 = c2 = 1 (DeepSpeed's
  update: its OnebitAdam takes bias_correction=True but never applies it, so false is the default
  here). Weight decay is decoupled (DeepSpeed adds wd p to the update), so with bias_correction=true
  the warm-up is torch.optim.AdamW exactly.
* compression, t > freeze_step: v stays frozen (with its correction c2 at freeze_step); each rank
  updates m with its own gradient, then m is replaced by its 1-bit compressed average over the
  ranks (dsrecipes.distributed.compressed_allreduce, error feedback per parameter), masked by the
  group's exp_avg_mask if any, and p moves as above.

See dsrecipes.training.optim.onebit_base for the process group, masks and checkpoints (errors reset on reload).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from dsrecipes.training.optim.onebit_base import OneBitOptimizer, check_onebit_hyperparameters

__all__ = ["OneBitAdam"]


class OneBitAdam(OneBitOptimizer):
    """1-bit Adam.

    Args:
        params: parameters or parameter groups (a group may hold `exp_avg_mask`).
        lr, betas, eps, weight_decay: Adam's (weight decay decoupled, as DeepSpeed's).
        freeze_step: uncompressed warm-up updates before the variance freezes and compression starts
            (DeepSpeed's default 100000; its tutorial: ~15-25% of the run). Must be >= 1.
        bias_correction: Adam's bias correction (false = DeepSpeed's update, see the module docstring).
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, freeze_step: int = 100000,
                 bias_correction: bool = False):
        check_onebit_hyperparameters("OneBitAdam", lr, betas, eps, weight_decay, freeze_step=freeze_step)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        super().__init__(params, defaults)
        self.freeze_step = freeze_step

    def needs_gradient_allreduce(self) -> bool:
        return self.steps_taken() + 1 <= self.freeze_step

    @property
    def compressing(self) -> bool:
        """Whether the next step is in the compression stage."""
        return not self.needs_gradient_allreduce()

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        loss = self.closure_loss(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p, state in self.params_to_step(group):
                t = int(state["step"])
                m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
                if wd != 0.0:
                    p.mul_(1 - lr * wd)
                m.lerp_(g, 1 - beta1)
                if t <= self.freeze_step:
                    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    bc1, bc2_sqrt = self.bias_corrections(t, beta1, beta2, group["bias_correction"])
                else:  # the variance stays as it was at the freeze; the momentum is averaged compressed
                    self.compress_(m, p)
                    self.apply_mask_(group, m)
                    bc1, _ = self.bias_corrections(t, beta1, beta2, group["bias_correction"])
                    _, bc2_sqrt = self.bias_corrections(self.freeze_step, beta1, beta2, group["bias_correction"])
                denom = (v.sqrt() / bc2_sqrt).add_(eps)
                p.addcdiv_(m, denom, value=-lr / bc1)
        return loss
