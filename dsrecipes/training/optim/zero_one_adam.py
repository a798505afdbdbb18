"""0/1 Adam (DeepSpeed's ZeroOneAdam, arXiv 2202.06009): adaptive variance freezing and 1-bit
synchronisation with local steps.

The algorithm of DeepSpeed <= 0.19.6 (deepspeed/runtime/fp16/onebit/zoadam.py with the compressed
all-reduce of deepspeed/runtime/comm/nccl.py); DeepSpeed 0.19.7 removed its 1-bit optimizers (PR #8490),
and 0.19.7+ refuses a config with "type": "ZeroOneAdam". Tested against a numpy re-statement of 0.19.6's
step(), step by step at two simulated ranks through the variance stage, local steps and syncs
(tests/unit/test_onebit_algorithms.py).

    optimizer=zerooneadam optimizer.var_freeze_step=100 launcher.nproc_per_node=2    # the recipe option

Per parameter p at step t (1-based); lr, betas (b1, b2), eps, wd as in Adam (weight decay decoupled):

* variance stage, t - 1 <= var_freeze_step. The variance is updated only at steps where
  t % var_interval == 0 (var_interval starts at 1 and doubles after every var_update_scaler such
  updates): those steps read the gradient averaged over the ranks (the `onebit` strategy lets DDP
  all-reduce it) and update m and v. At the other steps the rank's own gradient is averaged by the
  1-bit compressed all-reduce (error feedback per parameter) and only m moves. Then
      p = p (1 - lr wd) - lr (m / c1) / (sqrt(v) / c2 + eps)
* local-step stage, t - 1 > var_freeze_step (v frozen, DDP's all-reduce off for good): each rank
  takes local steps with its own gradient, m = b1 m + (1 - b1) g, u = m / d + wd p with
  d = sqrt(v) / c2 + eps, p = p - lr u, and accumulates lrs += lr. At steps where
  t % local_step_interval == 0 it synchronises: the local moves since the last sync,
  acc = p - p_sync (DeepSpeed's momentum accumulator, the sum of -lr u), are scaled by d and
  averaged by the 1-bit all-reduce (own error buffers: DeepSpeed resets the errors here because
  they now compensate another quantity), then m = -(acc d)_avg / lrs and p = p_sync + (acc d)_avg / d;
  lrs restarts from 0. (DeepSpeed undoes the local moves with p -= acc, which leaves each rank its
  own rounding, so the replicas drift apart; starting from the saved p_sync keeps them identical.)
  local_step_interval starts at 1 and doubles after every
  local_step_scaler steps, up to local_step_clipper.

c1 = 1 - b1^t and c2 = sqrt(1 - b2^k) (k: variance updates so far) with bias_correction; 1 without
(DeepSpeed's update, the default). Step t's kind is `schedule_kind(t)`: "full" / "onebit" / "local" / "sync".

Differences from DeepSpeed, deliberate: its first step() only allocates buffers (its counters run
one ahead, see dsrecipes.training.optim.onebit_base: its var_freeze_step V freezes where V - 1 does here, and its
interval tests see update t as t + 1, so within the doubling intervals its variance updates and syncs fall
one update earlier, e.g. variance updates at updates 1, 2, 3, 5, 7 against 1, 2, 4, 6, 8 here with
var_update_scaler=2); on checkpoint reload DeepSpeed resets the whole
schedule (intervals, counters, the momentum accumulator) with the errors, while here the schedule
and accumulator are saved and restored and only the compression errors
reset; the accumulator is kept as the parameters at the last sync.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from dsrecipes.training.optim.onebit_base import OneBitOptimizer, check_onebit_hyperparameters

__all__ = ["ZeroOneAdam"]


class ZeroOneAdam(OneBitOptimizer):
    """0/1 Adam.

    Args:
        params: parameters or parameter groups (a group may hold `exp_avg_mask`).
        lr, betas, eps, weight_decay: Adam's (weight decay decoupled).
        var_freeze_step: the last step that may update the variance (usually the end of the lr warm-up).
        var_update_scaler: kappa, variance updates between doublings of the update interval (16).
        local_step_scaler: steps between doublings of the local-step interval (32678).
        local_step_clipper: H, the largest local-step interval (16).
        bias_correction: Adam's bias correction (false = DeepSpeed's update).
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, var_freeze_step: int = 100000,
                 var_update_scaler: int = 16, local_step_scaler: int = 32678, local_step_clipper: int = 16,
                 bias_correction: bool = False):
        check_onebit_hyperparameters("ZeroOneAdam", lr, betas, eps, weight_decay, var_freeze_step=var_freeze_step,
                                     var_update_scaler=var_update_scaler, local_step_scaler=local_step_scaler,
                                     local_step_clipper=local_step_clipper)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        super().__init__(params, defaults)
        self.var_freeze_step = var_freeze_step
        self.var_update_scaler = var_update_scaler
        self.local_step_scaler = local_step_scaler
        self.local_step_clipper = local_step_clipper

    # ------------------------------------------------------------------ the schedule
    def _schedule_state(self) -> dict | None:
        return next((s for s in self.state.values() if "var_interval" in s), None)

    def variance_frozen(self, t: int) -> bool:
        return t - 1 > self.var_freeze_step

    def schedule_kind(self, t: int | None = None) -> str:
        """What step t (default: the coming one) does: full (averaged gradient, m and v), onebit
        (compressed gradient, m only), local (a local step), sync (a local step, then the momentum sync)."""
        t = self.steps_taken() + 1 if t is None else t
        state = self._schedule_state() or {"var_interval": 1, "local_step_interval": 1}
        if not self.variance_frozen(t):
            return "full" if t % state["var_interval"] == 0 else "onebit"
        return "sync" if t % state["local_step_interval"] == 0 else "local"

    def needs_gradient_allreduce(self) -> bool:
        return self.schedule_kind() == "full"

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        loss = self.closure_loss(closure)
        t = self.steps_taken() + 1
        kind = self.schedule_kind(t)
        if kind in ("local", "sync"):  # the gradient-error buffers are done with (DeepSpeed resets them here)
            for key in [k for k in self._errors if isinstance(k, tuple) and k[1] == "grad"]:
                del self._errors[key]
        for group in self.param_groups:
            for p, state in self.params_to_step(group):
                if kind in ("full", "onebit"):
                    self._variance_stage(p, state, group, kind, t)
                else:
                    self._local_stage(p, state, group, kind, t)
        return loss

    def init_state(self, p: torch.Tensor, state: dict) -> None:
        super().init_state(p, state)
        state.update(var_interval=1, var_counter=0, var_updates=0, local_step_interval=1, local_step_counter=0,
                     lrs=0.0)

    def _denominator(self, state: dict, group: dict) -> torch.Tensor:
        beta1, beta2 = group["betas"]
        _, bc2_sqrt = self.bias_corrections(state["var_updates"], beta1, beta2,
                                            group["bias_correction"] and state["var_updates"] > 0)
        return (state["exp_avg_sq"].sqrt() / bc2_sqrt).add_(group["eps"])

    def _variance_stage(self, p, state: dict, group: dict, kind: str, t: int) -> None:
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
        if kind == "full":
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            state["var_updates"] += 1
        else:
            g = self.compress_(g.clone(), (p, "grad"))
            self.apply_mask_(group, g)
        m.lerp_(g, 1 - beta1)
        if wd != 0.0:
            p.mul_(1 - lr * wd)
        bc1, _ = self.bias_corrections(t, beta1, beta2, group["bias_correction"])
        p.addcdiv_(m, self._denominator(state, group), value=-lr / bc1)
        if kind == "full":
            state["var_counter"] += 1
            if state["var_counter"] == self.var_update_scaler:
                state["var_counter"] = 0
                state["var_interval"] *= 2

    def _local_stage(self, p, state: dict, group: dict, kind: str, t: int) -> None:
        beta1, beta2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        m = state["exp_avg"]
        if "params_at_sync" not in state:  # the first local step: the ranks' common starting point
            state["params_at_sync"] = p.detach().clone()
        m.lerp_(p.grad, 1 - beta1)
        state["lrs"] += lr
        denom = self._denominator(state, group)
        bc1, _ = self.bias_corrections(t, beta1, beta2, group["bias_correction"])
        update = m / denom / bc1
        if wd != 0.0:
            update.add_(p, alpha=wd)
        p.add_(update, alpha=-lr)
        if kind == "sync":
            start = state["params_at_sync"]
            moved = (p - start).mul_(denom)  # the local moves (DeepSpeed's accumulator), in momentum units
            self.compress_(moved, (p, "momentum"))
            self.apply_mask_(group, moved)
            torch.div(moved, -state["lrs"], out=m)
            # the ranks' average move replayed from the common start: identical parameters on every rank
            torch.add(start, moved / denom, out=p)
            start.copy_(p)
            state["lrs"] = 0.0
        state["local_step_counter"] += 1
        if state["local_step_counter"] == self.local_step_scaler:
            state["local_step_counter"] = 0
            state["local_step_interval"] = min(self.local_step_clipper, state["local_step_interval"] * 2)
