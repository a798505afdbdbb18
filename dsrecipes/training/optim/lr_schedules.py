"""Learning-rate schedules with DeepSpeed's formulas, stepped once per applied optimizer step.

What: DeepSpeed's five schedules (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)
plus a constant one, each an option of the lr_scheduler group (warmup_lr, ..., constant), or any
torch scheduler class (torch_step: StepLR; custom: `lr_scheduler._target_` by import path). Each
option names its class in `_target_` and its arguments as flat keys; it is built as
`_target_(optimizer, **keys)` through dsrecipes.utils.instantiate. Why: a recipe ported from a
DeepSpeed config should see the same lr curve (and, for OneCycle, the same momentum curve), while
the objects stay ordinary torch `LRScheduler`s, so `state_dict()`, `load_state_dict()`,
`get_last_lr()` and every tool that expects a torch scheduler work unchanged.

Step convention (`step_alignment`, see LRSchedulerConfig): `t` is DeepSpeed's
`last_batch_iteration`. With the default, step_alignment=dsrecipes, it is read as "the 0-based
index of the optimizer step the lr is used for": as with torch's LambdaLR, building a scheduler
already puts f(0) into the optimizer, and after k calls of `step()` the optimizer holds f(k)
(`last_epoch == k`). With step_alignment=deepspeed the optimizer holds what DeepSpeed's objects and
engine give it: a placeholder (`placeholder_lrs()`: warmup_min_lr, 0, cycle_min_lr ...) until the
first step() and f(k - 1) after k of them, so optimizer step k uses f(k - 1) (`lrs_for_step`).

Each formula is also a pure function of `t` (`warmup_lr`, `warmup_decay_lr`,
`warmup_cosine_ratio`, `one_cycle_lr`, `one_cycle_momentum`, `lr_range_test_lr`; on a schedule
object `lrs_at(t)`) so it can be checked and plotted without an optimizer. Every lr is a
closed-form function of `t`, never of the previous lr, which makes a resumed run continue exactly.

Saved state: `state_dict()` holds the progress (`last_epoch`, `_step_count`, `base_lrs`, the last
lrs and momenta), not the schedule's hyperparameters: like DeepSpeed (whose state is
`{'last_batch_iteration': t}`), the shape of a resumed schedule comes from the config it is built
from. `load_state_dict()` also writes the loaded step's lr (and momentum) into the optimizer, so
the order of loading optimizer and scheduler state does not matter.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from dsrecipes.training.config import check_option
from dsrecipes.training.optim.lr_scheduler_config import (
    LR_SCHEDULER_SCHEMAS,
    LRRangeTestConfig,
    LRSchedulerConfig,
    OneCycleConfig,
    StepAlignment,
    WarmupCosineConfig,
    WarmupDecayLRConfig,
    WarmupKeys,
    WarmupLRConfig,
    WarmupType,
)
from dsrecipes.training.option_schemas import config_items
from dsrecipes.utils.config_enum import check_choice
from dsrecipes.utils.instantiate import instantiate

LR_SCHEDULERS = tuple(LR_SCHEDULER_SCHEMAS)
WARMUP_TYPES = tuple(t.value for t in WarmupType)
STEP_ALIGNMENTS = tuple(a.value for a in StepAlignment)

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Pure formulas (t = 0-based optimizer step the value is used for)
# --------------------------------------------------------------------------------------------


def warmup_gamma(t: int, warmup_num_steps: int, warmup_type: str) -> float:
    """Warmup progress in [0, 1] at step t: log(t+1)/log(N) (log) or t/N (linear) for t < N, else 1.

    N = max(2, warmup_num_steps), as in DeepSpeed (so 0 and 1 behave like 2; log(1) would divide by 0).
    """
    n = max(2, warmup_num_steps)
    if warmup_type not in WARMUP_TYPES:
        raise ValueError(f"warmup_type={warmup_type!r} is not valid; choose one of: {', '.join(WARMUP_TYPES)}")
    if t >= n:
        return 1.0
    if warmup_type == "log":
        return math.log(t + 1) / math.log(n)
    return t / n


def warmup_lr(t: int, *, warmup_min_lr: float, warmup_max_lr: float, warmup_num_steps: int, warmup_type: str) -> float:
    """DeepSpeed WarmupLR: min + (max - min) * gamma(t); constant at warmup_max_lr once t >= N."""
    return warmup_min_lr + (warmup_max_lr - warmup_min_lr) * warmup_gamma(t, warmup_num_steps, warmup_type)


def warmup_decay_lr(
    t: int, *, total_num_steps: int, warmup_min_lr: float, warmup_max_lr: float, warmup_num_steps: int,
    warmup_type: str,
) -> float:
    """DeepSpeed WarmupDecayLR: WarmupLR's warmup, then gamma = max(0, (T - t) / max(1, T - N)).

    The lr is min + (max - min) * gamma, so it falls linearly from warmup_max_lr at t = N to
    warmup_min_lr (0 by default) at t = T = total_num_steps and stays there.
    """
    n = max(2, warmup_num_steps)
    if t < n:
        gamma = warmup_gamma(t, warmup_num_steps, warmup_type)
    else:
        gamma = max(0.0, (total_num_steps - t) / max(1, total_num_steps - n))
    return warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma


def warmup_cosine_ratio(
    t: int, *, total_num_steps: int, warmup_num_steps: int, warmup_min_ratio: float, cos_min_ratio: float,
    warmup_type: str,
) -> float:
    """DeepSpeed WarmupCosineLR: the multiplier of the optimizer's initial lr at step t.

    Warmup (t < N): r = wmin + (1 - wmin) * gamma(t). After: p = min(1, (t - N + 1) / max(1, T - N)),
    r = max(0, cmin + (1 - cmin) * (1 + cos(pi * p)) / 2), so r reaches cos_min_ratio at t = T - 1
    and stays there. N = max(2, warmup_num_steps).
    """
    n = max(2, warmup_num_steps)
    if t < n:
        gamma = warmup_gamma(t, warmup_num_steps, warmup_type)
        return warmup_min_ratio + (1.0 - warmup_min_ratio) * gamma
    progress = min(1.0, (t - n + 1) / max(1, total_num_steps - n))
    return max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def one_cycle_scale(
    t: int, *, cycle_first_step_size: int, cycle_second_step_size: int | None = None,
    cycle_first_stair_count: int = 0, cycle_second_stair_count: int | None = None,
) -> float:
    """Position on OneCycle's triangle at step t, in [0, 1]: 0 = the min lr / max momentum end.

    As in DeepSpeed, the triangle is evaluated at b = t + 1 (so t = 0 is already one step up the
    ramp): with c = b mod (S1 + S2), the scale is c / S1 on the way up (c <= S1) and
    (S1 + S2 - c) / S2 on the way down. So it peaks at t = S1 - 1 and is back at 0 at
    t = S1 + S2 - 1, the cycle's last step. A stair count K > 0 for a half holds the value flat:
    floor(position * K) / K, computed from the integer step so that exact stairs (and the peak)
    are never lost to rounding. cycle_second_* default to cycle_first_*.
    """
    first = cycle_first_step_size
    second = first if cycle_second_step_size is None else cycle_second_step_size
    second_stairs = cycle_first_stair_count if cycle_second_stair_count is None else cycle_second_stair_count
    total = first + second
    c = (t + 1) % total
    if c <= first:
        steps, size, stairs = c, first, cycle_first_stair_count
    else:
        steps, size, stairs = total - c, second, second_stairs
    if stairs > 0:
        return ((steps * stairs) // size) / stairs
    return steps / size


def _after_cycle(t: int, cycle_first_step_size: int, cycle_second_step_size: int | None) -> int | None:
    """Steps since the cycle ended, counting t = S1 + S2 as 1 (DeepSpeed's decay index); None inside it."""
    second = cycle_first_step_size if cycle_second_step_size is None else cycle_second_step_size
    total = cycle_first_step_size + second
    return None if t < total else t - total + 1


def one_cycle_lr(
    t: int, *, cycle_min_lr: float, cycle_max_lr: float, decay_lr_rate: float = 0.0,
    cycle_first_step_size: int = 2000, cycle_second_step_size: int | None = None,
    cycle_first_stair_count: int = 0, cycle_second_stair_count: int | None = None, decay_step_size: int = 0,
) -> float:
    """DeepSpeed OneCycle lr at step t: min -> max -> min over the cycle, then decay.

    In the cycle: min + (max - min) * one_cycle_scale(t). After it, with
    t_after = t - (S1 + S2) + 1: cycle_min_lr / (1 + decay_lr_rate * t_after / decay_step_size)
    (continuous, not floored); decay_lr_rate == 0 or decay_step_size == 0 keeps cycle_min_lr.
    """
    t_after = _after_cycle(t, cycle_first_step_size, cycle_second_step_size)
    if t_after is None:
        scale = one_cycle_scale(
            t, cycle_first_step_size=cycle_first_step_size, cycle_second_step_size=cycle_second_step_size,
            cycle_first_stair_count=cycle_first_stair_count, cycle_second_stair_count=cycle_second_stair_count,
        )
        return cycle_min_lr + (cycle_max_lr - cycle_min_lr) * scale
    if decay_lr_rate == 0 or decay_step_size == 0:
        return cycle_min_lr
    return cycle_min_lr / (1.0 + decay_lr_rate * (t_after / decay_step_size))


def one_cycle_momentum(
    t: int, *, cycle_min_mom: float, cycle_max_mom: float, decay_mom_rate: float = 0.0,
    cycle_first_step_size: int = 2000, cycle_second_step_size: int | None = None,
    cycle_first_stair_count: int = 0, cycle_second_stair_count: int | None = None, decay_step_size: int = 0,
) -> float:
    """DeepSpeed OneCycle momentum at step t: max -> min -> max over the cycle (mirror of the lr).

    In the cycle: max - (max - min) * one_cycle_scale(t). After it, DeepSpeed's formula is
    cycle_max_mom * (1 + decay_mom_rate * t_after / decay_step_size): note it MULTIPLIES, so a
    positive decay_mom_rate raises the momentum (validate_lr_scheduler_config rejects rates that
    push it to >= 1 or below 0 within the run). decay_mom_rate == 0 or decay_step_size == 0 keeps
    cycle_max_mom.
    """
    t_after = _after_cycle(t, cycle_first_step_size, cycle_second_step_size)
    if t_after is None:
        scale = one_cycle_scale(
            t, cycle_first_step_size=cycle_first_step_size, cycle_second_step_size=cycle_second_step_size,
            cycle_first_stair_count=cycle_first_stair_count, cycle_second_stair_count=cycle_second_stair_count,
        )
        return cycle_max_mom - (cycle_max_mom - cycle_min_mom) * scale
    if decay_mom_rate == 0 or decay_step_size == 0:
        return cycle_max_mom
    return cycle_max_mom * (1.0 + decay_mom_rate * (t_after / decay_step_size))


def lr_range_test_lr(
    t: int, *, lr_range_test_min_lr: float, lr_range_test_step_size: int, lr_range_test_step_rate: float,
    lr_range_test_staircase: bool,
) -> float:
    """DeepSpeed LRRangeTest: min_lr * (1 + rate * interval), interval = (t+1)/step_size (floored if staircase)."""
    if lr_range_test_staircase:
        interval = float((t + 1) // lr_range_test_step_size)
    else:
        interval = (t + 1) / lr_range_test_step_size
    return lr_range_test_min_lr * (1.0 + lr_range_test_step_rate * interval)


# --------------------------------------------------------------------------------------------
# torch LRScheduler classes
# --------------------------------------------------------------------------------------------


def _momentum_key(optimizer: torch.optim.Optimizer) -> str | None:
    """The param-group key holding momentum: 'betas' (Adam family, Lion), 'momentum' (SGD, RMSprop) or None."""
    if "betas" in optimizer.defaults:
        return "betas"
    if "momentum" in optimizer.defaults:
        return "momentum"
    return None


def _set_group_value(group: dict, key: str, value: float) -> None:
    """group[key] = value, filling in place when the group holds a tensor (tensor lr / capturable betas)."""
    if isinstance(group[key], torch.Tensor):
        group[key].fill_(value)
    else:
        group[key] = value


class ClosedFormLR(LRScheduler):
    """Base of this module's schedules: lr (and optionally momentum) is a pure function of the step.

    Subclasses set `self.hparams` (the schedule's settings, not saved in state_dict) before calling
    `super().__init__(optimizer, step_alignment)` and implement `lrs_at(t)` (and `placeholder_lrs()`,
    the value DeepSpeed's object installs before its first step); `momenta_at(t)` returns None
    unless the schedule drives momentum. `lrs_for_step(k)` is what optimizer step k uses under the
    schedule's step_alignment: f(k) (dsrecipes), or the placeholder for k = 0 and f(k - 1) after
    (deepspeed). The alignment comes from the config, like the hyperparameters: it is not saved.
    """

    _NOT_SAVED = ("optimizer", "hparams", "_momentum_key", "step_alignment")

    def __init__(self, optimizer: torch.optim.Optimizer, step_alignment: str = "dsrecipes") -> None:
        """Install the value of optimizer step 0 (torch's LRScheduler init performs the first step)."""
        if step_alignment not in STEP_ALIGNMENTS:
            raise ValueError(f"step_alignment={step_alignment!r} is not valid; choose one of: {', '.join(STEP_ALIGNMENTS)}")
        self.step_alignment = str(step_alignment)
        if not hasattr(self, "hparams"):
            self.hparams: dict[str, Any] = {}
        if not hasattr(self, "_momentum_key"):
            self._momentum_key: str | None = None
        self._last_momentum: list[float] | None = None
        super().__init__(optimizer)

    def lrs_at(self, t: int) -> list[float]:
        """The formula: the lr of every param group at schedule index t (DeepSpeed's last_batch_iteration)."""
        raise NotImplementedError

    def momenta_at(self, t: int) -> list[float] | None:
        """The momentum (beta1 / SGD momentum) of every param group at step t, or None to leave it alone."""
        return None

    def placeholder_lrs(self) -> list[float]:
        """What DeepSpeed's object puts into the optimizer at construction (step_alignment=deepspeed's step 0)."""
        return self.lrs_at(0)

    def placeholder_momenta(self) -> list[float] | None:
        """The momentum DeepSpeed's object installs at construction (None: it leaves momentum alone)."""
        return self.momenta_at(0)

    def _deepspeed_placeholder(self, k: int) -> bool:
        return self.step_alignment == "deepspeed" and k <= 0

    def lrs_for_step(self, k: int) -> list[float]:
        """The lrs optimizer step k (0-based) uses: f(k), or under step_alignment=deepspeed f(k - 1)
        (the placeholder for k = 0)."""
        if self._deepspeed_placeholder(k):
            return self.placeholder_lrs()
        return self.lrs_at(k - 1 if self.step_alignment == "deepspeed" else k)

    def momenta_for_step(self, k: int) -> list[float] | None:
        """The momenta optimizer step k uses, aligned as lrs_for_step (None if momentum is not scheduled)."""
        if self._deepspeed_placeholder(k):
            return self.placeholder_momenta()
        return self.momenta_at(k - 1 if self.step_alignment == "deepspeed" else k)

    def get_lr(self) -> list[float]:
        """torch hook: the lrs for the current `last_epoch` (the number of step() calls so far)."""
        return self.lrs_for_step(self.last_epoch)

    def _get_closed_form_lr(self) -> list[float]:
        """torch hook used by the deprecated step(epoch): the same closed form."""
        return self.lrs_for_step(self.last_epoch)

    def step(self, epoch: int | None = None) -> None:
        """Advance one optimizer step: set the lr (torch) and, where scheduled, the momentum."""
        super().step(epoch)
        self._apply_momentum()

    def _apply_momentum(self) -> None:
        """Write momenta_for_step(last_epoch) into the optimizer's groups (beta1 keeps beta2)."""
        momenta = self.momenta_for_step(self.last_epoch)
        if momenta is None or self._momentum_key is None:
            return
        for group, mom in zip(self.optimizer.param_groups, momenta):
            if self._momentum_key == "betas":
                beta1, beta2 = group["betas"]
                if isinstance(beta1, torch.Tensor):
                    beta1.fill_(mom)
                else:
                    group["betas"] = (mom, beta2)
            else:
                _set_group_value(group, "momentum", mom)
        self._last_momentum = [float(m) for m in momenta]

    def get_last_momentum(self) -> list[float] | None:
        """The momentum last written per param group (None if this schedule does not drive momentum)."""
        return self._last_momentum

    def state_dict(self) -> dict[str, Any]:
        """Progress only (last_epoch, _step_count, base_lrs, last lrs/momenta); hyperparameters come from the config."""
        return {k: v for k, v in self.__dict__.items() if k not in self._NOT_SAVED}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the progress and write the loaded step's lr and momentum into the optimizer."""
        self.__dict__.update({k: v for k, v in state_dict.items() if k not in self._NOT_SAVED})
        for group, lr in zip(self.optimizer.param_groups, self.lrs_for_step(self.last_epoch)):
            _set_group_value(group, "lr", lr)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]
        self._apply_momentum()

    def _base(self) -> list[float]:
        """The optimizer's initial lr per param group, as floats."""
        return [float(b) for b in self.base_lrs]


class ConstantSchedule(ClosedFormLR):
    """name=constant: the optimizer's initial lr at every step."""

    def lrs_at(self, t: int) -> list[float]:
        """The initial lrs, unchanged."""
        return self._base()


class WarmupLR(ClosedFormLR):
    """DeepSpeed WarmupLR: warmup_min_lr -> warmup_max_lr over warmup_num_steps (log or linear), then constant.

    warmup_max_lr=None means each param group's own initial lr, as in DeepSpeed 0.19.8 (whose
    WarmupLR reads `[group['lr'] for group in optimizer.param_groups]`). DeepSpeed's placeholder
    before the first step is warmup_min_lr.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, warmup_min_lr: float = 0.0, warmup_max_lr: float | None = None,
        warmup_num_steps: int = 1000, warmup_type: str = "log", step_alignment: str = "dsrecipes",
    ) -> None:
        """Settings as DeepSpeed's WarmupLR params; see warmup_lr()."""
        self.hparams = dict(
            warmup_min_lr=warmup_min_lr, warmup_max_lr=warmup_max_lr, warmup_num_steps=warmup_num_steps,
            warmup_type=warmup_type,
        )
        super().__init__(optimizer, step_alignment)

    def placeholder_lrs(self) -> list[float]:
        """warmup_min_lr in every group (DeepSpeed's get_lr() while last_batch_iteration < 0)."""
        return [self.hparams["warmup_min_lr"]] * len(self.optimizer.param_groups)

    def _max_lrs(self) -> list[float]:
        """warmup_max_lr per group (the group's initial lr when it is None)."""
        peak = self.hparams["warmup_max_lr"]
        return self._base() if peak is None else [peak] * len(self.base_lrs)

    def lrs_at(self, t: int) -> list[float]:
        """warmup_lr(t) per group."""
        h = self.hparams
        return [
            warmup_lr(t, warmup_min_lr=h["warmup_min_lr"], warmup_max_lr=peak, warmup_num_steps=h["warmup_num_steps"],
                      warmup_type=h["warmup_type"])
            for peak in self._max_lrs()
        ]


class WarmupDecayLR(WarmupLR):
    """DeepSpeed WarmupDecayLR: WarmupLR's warmup, then linear decay to warmup_min_lr at total_num_steps."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_num_steps: int, warmup_min_lr: float = 0.0,
        warmup_max_lr: float | None = None, warmup_num_steps: int = 1000, warmup_type: str = "log",
        step_alignment: str = "dsrecipes",
    ) -> None:
        """Settings as DeepSpeed's WarmupDecayLR params (but warmup_max_lr=None is each group's lr,
        as in WarmupLR, where DeepSpeed's WarmupDecayLR signature defaults it to 0.001); see warmup_decay_lr()."""
        self.hparams = dict(
            total_num_steps=total_num_steps, warmup_min_lr=warmup_min_lr, warmup_max_lr=warmup_max_lr,
            warmup_num_steps=warmup_num_steps, warmup_type=warmup_type,
        )
        # skip WarmupLR.__init__: hparams already include total_num_steps
        ClosedFormLR.__init__(self, optimizer, step_alignment)

    def lrs_at(self, t: int) -> list[float]:
        """warmup_decay_lr(t) per group."""
        h = self.hparams
        return [
            warmup_decay_lr(t, total_num_steps=h["total_num_steps"], warmup_min_lr=h["warmup_min_lr"],
                            warmup_max_lr=peak, warmup_num_steps=h["warmup_num_steps"], warmup_type=h["warmup_type"])
            for peak in self._max_lrs()
        ]


class WarmupCosineLR(ClosedFormLR):
    """DeepSpeed WarmupCosineLR: each group's initial lr times warmup_cosine_ratio(t)."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0,
        warmup_num_steps: int = 1000, cos_min_ratio: float = 0.0001, warmup_type: str = "log",
        step_alignment: str = "dsrecipes",
    ) -> None:
        """Settings as DeepSpeed's WarmupCosineLR params; see warmup_cosine_ratio()."""
        self.hparams = dict(
            total_num_steps=total_num_steps, warmup_min_ratio=warmup_min_ratio, warmup_num_steps=warmup_num_steps,
            cos_min_ratio=cos_min_ratio, warmup_type=warmup_type,
        )
        super().__init__(optimizer, step_alignment)

    def lrs_at(self, t: int) -> list[float]:
        """Initial lr x ratio per group."""
        ratio = warmup_cosine_ratio(t, **self.hparams)
        return [base * ratio for base in self._base()]

    def placeholder_lrs(self) -> list[float]:
        """0 in every group (DeepSpeed's get_lr() while last_batch_iteration < 0; not warmup_min_ratio)."""
        return [0.0] * len(self.optimizer.param_groups)


class OneCycle(ClosedFormLR):
    """DeepSpeed OneCycle: one triangular lr cycle (with optional stairs) and inverse momentum cycle, then decay.

    The lr is absolute (cycle_min_lr / cycle_max_lr, the optimizer's lr is not used). With
    cycle_momentum the momentum follows one_cycle_momentum(): it is written to betas[0] of
    optimizers with `betas` (Adam family, Lion) and to `momentum` of optimizers that have that key
    instead (SGD, RMSprop). Optimizers with neither key keep their settings and a warning is logged.
    Two deliberate differences from DeepSpeed 0.19.8 (OneCycle._initialize_momentum / step):

    * betas[1] is kept. DeepSpeed writes (momentum, 0.99) into `betas` at construction and at every
      step, replacing the optimizer's beta2 with a literal 0.99 for the whole run; to reproduce it,
      configure the optimizer's beta2 as 0.99 (the same trajectory);
    * SGD / RMSprop `momentum` is cycled. DeepSpeed only looks for `betas` and otherwise disables
      cycle_momentum with the warning "optimizer SGD does not support momentum" (its own docstring
      example is SGD with momentum=0.9); to reproduce it, set cycle_momentum=false for them.

    DeepSpeed's placeholder before the first step: lr cycle_min_lr, momentum cycle_min_mom.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, cycle_min_lr: float, cycle_max_lr: float, decay_lr_rate: float = 0.0,
        cycle_first_step_size: int = 2000, cycle_second_step_size: int | None = None,
        cycle_first_stair_count: int = 0, cycle_second_stair_count: int | None = None, decay_step_size: int = 0,
        cycle_momentum: bool = True, cycle_min_mom: float = 0.8, cycle_max_mom: float = 0.9,
        decay_mom_rate: float = 0.0, step_alignment: str = "dsrecipes",
    ) -> None:
        """Settings as DeepSpeed's OneCycle params; see one_cycle_lr() and one_cycle_momentum()."""
        shape = dict(
            cycle_first_step_size=cycle_first_step_size, cycle_second_step_size=cycle_second_step_size,
            cycle_first_stair_count=cycle_first_stair_count, cycle_second_stair_count=cycle_second_stair_count,
            decay_step_size=decay_step_size,
        )
        self.hparams = dict(
            lr=dict(shape, cycle_min_lr=cycle_min_lr, cycle_max_lr=cycle_max_lr, decay_lr_rate=decay_lr_rate),
            momentum=(
                dict(shape, cycle_min_mom=cycle_min_mom, cycle_max_mom=cycle_max_mom, decay_mom_rate=decay_mom_rate)
                if cycle_momentum else None
            ),
        )
        self._momentum_key = _momentum_key(optimizer) if cycle_momentum else None
        if cycle_momentum and self._momentum_key is None:
            _log.warning(
                "lr_scheduler one_cycle: cycle_momentum is ignored, %s has neither `betas` nor `momentum`",
                type(optimizer).__name__,
            )
        super().__init__(optimizer, step_alignment)

    def lrs_at(self, t: int) -> list[float]:
        """one_cycle_lr(t), the same for every group."""
        return [one_cycle_lr(t, **self.hparams["lr"])] * len(self.optimizer.param_groups)

    def placeholder_lrs(self) -> list[float]:
        """cycle_min_lr (what DeepSpeed's OneCycle writes at construction)."""
        return [self.hparams["lr"]["cycle_min_lr"]] * len(self.optimizer.param_groups)

    def placeholder_momenta(self) -> list[float] | None:
        """cycle_min_mom (DeepSpeed writes (cycle_min_mom, 0.99) into betas at construction), or None."""
        if self.hparams["momentum"] is None or self._momentum_key is None:
            return None
        return [self.hparams["momentum"]["cycle_min_mom"]] * len(self.optimizer.param_groups)

    def momenta_at(self, t: int) -> list[float] | None:
        """one_cycle_momentum(t) per group, or None when momentum is not cycled."""
        if self.hparams["momentum"] is None or self._momentum_key is None:
            return None
        return [one_cycle_momentum(t, **self.hparams["momentum"])] * len(self.optimizer.param_groups)


class LRRangeTest(ClosedFormLR):
    """DeepSpeed LRRangeTest: lr grows linearly (or in stairs) from lr_range_test_min_lr; absolute lr."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, lr_range_test_min_lr: float = 1e-3, lr_range_test_step_size: int = 2000,
        lr_range_test_step_rate: float = 1.0, lr_range_test_staircase: bool = False, step_alignment: str = "dsrecipes",
    ) -> None:
        """Settings as DeepSpeed's LRRangeTest params; see lr_range_test_lr()."""
        self.hparams = dict(
            lr_range_test_min_lr=lr_range_test_min_lr, lr_range_test_step_size=lr_range_test_step_size,
            lr_range_test_step_rate=lr_range_test_step_rate, lr_range_test_staircase=lr_range_test_staircase,
        )
        super().__init__(optimizer, step_alignment)

    def lrs_at(self, t: int) -> list[float]:
        """lr_range_test_lr(t), the same for every group."""
        return [lr_range_test_lr(t, **self.hparams)] * len(self.optimizer.param_groups)

    def placeholder_lrs(self) -> list[float]:
        """lr_range_test_min_lr (what DeepSpeed's LRRangeTest writes at construction)."""
        return [self.hparams["lr_range_test_min_lr"]] * len(self.optimizer.param_groups)


# --------------------------------------------------------------------------------------------
# Config: validation and construction through _target_
# --------------------------------------------------------------------------------------------

# Arguments the engine sets: a config key must not name them.
_RESERVED_ARGUMENTS = {
    "optimizer": "the engine passes its optimizer",
    "last_epoch": "the step comes from the checkpoint on resume (trainer.resume)",
}


def _target_class(cfg: LRSchedulerConfig, prefix: str) -> Any:
    """What `_target_` names (imported through dsrecipes.utils.instantiate), without building it."""
    return instantiate({"_target_": cfg._target_, "_partial_": True}, prefix).func


def _is_closed_form(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, ClosedFormLR)


def _constructor_arguments(cfg: LRSchedulerConfig, max_steps: int, prefix: str = "lr_scheduler") -> dict[str, Any]:
    """The class's arguments besides the optimizer: every key but name / _target_; null total_num_steps = max_steps.

    step_alignment goes to this module's schedules only: a torch scheduler is stepped by DeepSpeed
    with torch's own convention, which is dsrecipes', so both alignments build it the same.
    """
    arguments = {k: v for k, v in config_items(cfg).items() if k not in ("name", "_target_", "step_alignment")}
    if "total_num_steps" in arguments and arguments["total_num_steps"] is None:
        arguments["total_num_steps"] = max_steps
    if _is_closed_form(_target_class(cfg, prefix)):
        arguments["step_alignment"] = str(cfg.step_alignment)
    return arguments


def _scheduler_target(cfg: LRSchedulerConfig, max_steps: int, prefix: str) -> functools.partial:
    """partial(_target_, **arguments) through dsrecipes.utils.instantiate; call it with the optimizer."""
    node = {"_target_": cfg._target_, "_partial_": True, **_constructor_arguments(cfg, max_steps, prefix)}
    return instantiate(node, prefix)


def _target_name(cls: Any) -> str:
    """module.QualName of a class, for messages."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_reserved(cfg: LRSchedulerConfig, prefix: str) -> None:
    """ValueError for a key naming an argument the engine sets, or one of Hydra's reserved `_x_` keys."""
    for key in config_items(cfg):
        if key in _RESERVED_ARGUMENTS:
            raise ValueError(f"{prefix}.{key} is not allowed: {_RESERVED_ARGUMENTS[key]}")
        if key.startswith("_") and key != "_target_":
            raise ValueError(f"{prefix}.{key} is not allowed: keys starting with '_' are Hydra's")


def _check_target(cfg: LRSchedulerConfig, target: functools.partial, prefix: str) -> None:
    """ValueError unless _target_ is an LRScheduler class taking every key (the typo check for `custom`)."""
    cls = target.func
    if not (isinstance(cls, type) and issubclass(cls, LRScheduler)):
        raise ValueError(f"{prefix}._target_={cfg._target_!r} is not a torch.optim.lr_scheduler.LRScheduler subclass "
                         "(e.g. torch.optim.lr_scheduler.StepLR)")
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no introspectable signature: construction will tell
        return
    params = list(signature.parameters.values())[1:]  # after the optimizer
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        names = [p.name for p in params if p.kind is not p.VAR_POSITIONAL]
        for key in target.keywords:
            if key not in names:
                settable = [n for n in names if n not in _RESERVED_ARGUMENTS]
                raise ValueError(f"{prefix}.{key} is not an argument of {_target_name(cls)} ({prefix}._target_); "
                                 f"it takes: {', '.join(settable)}")
    try:
        signature.bind(None, **target.keywords)
    except TypeError as err:
        raise ValueError(f"{prefix}: {_target_name(cls)} cannot be built from these keys: {err}") from err


def _fail(key: str, value: Any, requirement: str) -> None:
    """Raise the module's standard ValueError: `key=value requirement`."""
    raise ValueError(f"{key}={value!r} {requirement}")


def _at_least(key: str, value: Any, low: float, strict: bool = False) -> None:
    """ValueError unless value >= low (> low when strict)."""
    if value < low or (strict and value == low):
        _fail(key, value, f"must be {'>' if strict else '>='} {low}")


def _in_unit(key: str, value: float, include_one: bool = True) -> None:
    """ValueError unless 0 <= value <= 1 (< 1 when not include_one)."""
    if not (0.0 <= value <= 1.0) or (not include_one and value == 1.0):
        _fail(key, value, f"must be in [0, 1{']' if include_one else ')'}")


def _check_warmup(cfg: WarmupKeys, max_steps: int, prefix: str) -> None:
    """warmup_type, and warmup_num_steps >= 1 as DeepSpeed requires (its ValueError "warmup_num_steps
    must be a positive integer"; 1 behaves as 2, N = max(2, warmup_num_steps))."""
    check_choice(f"{prefix}.warmup_type", cfg.warmup_type, WARMUP_TYPES)
    _at_least(f"{prefix}.warmup_num_steps", cfg.warmup_num_steps, 1)


def _check_total(cfg: WarmupDecayLRConfig | WarmupCosineConfig, max_steps: int, prefix: str) -> None:
    """total_num_steps > 0 when set (null = max_steps)."""
    if cfg.total_num_steps is not None:
        _at_least(f"{prefix}.total_num_steps", cfg.total_num_steps, 0, strict=True)


def _check_warmup_bounds(cfg: WarmupLRConfig, max_steps: int, prefix: str) -> None:
    """warmup_min_lr >= 0 and warmup_max_lr > 0 when set (null = the optimizer's lr)."""
    _at_least(f"{prefix}.warmup_min_lr", cfg.warmup_min_lr, 0)
    if cfg.warmup_max_lr is not None:
        _at_least(f"{prefix}.warmup_max_lr", cfg.warmup_max_lr, 0, strict=True)


def _check_total_after_warmup(cfg: WarmupDecayLRConfig, max_steps: int, prefix: str) -> None:
    """Warn, as DeepSpeed does, when total_num_steps < max(2, warmup_num_steps): WarmupDecayLR is then
    at warmup_min_lr from the end of the warmup on, with no decay window. (DeepSpeed logs the same for
    WarmupCosineLR; here that one stays silent, as before: the library path's default schedule, 1000
    warmup steps over trainer.max_steps=600, would warn on every dsrecipes.initialize.)"""
    total = cfg.total_num_steps if cfg.total_num_steps is not None else max_steps
    if total < max(2, cfg.warmup_num_steps):
        source = "" if cfg.total_num_steps is not None else f" (null = max_steps={max_steps})"
        warnings.warn(
            f"{prefix}.total_num_steps={cfg.total_num_steps!r}{source} is less than {prefix}.warmup_num_steps="
            f"{cfg.warmup_num_steps}: {cfg.name} drops to its floor right after the warmup (no decay window)",
            stacklevel=4,
        )


def _check_cosine_ratios(cfg: WarmupCosineConfig, max_steps: int, prefix: str) -> None:
    """WarmupCosineLR's ratios are fractions of the optimizer's lr."""
    _in_unit(f"{prefix}.warmup_min_ratio", cfg.warmup_min_ratio)
    _in_unit(f"{prefix}.cos_min_ratio", cfg.cos_min_ratio)


def _check_one_cycle(cfg: OneCycleConfig, max_steps: int, prefix: str) -> None:
    """OneCycle's bounds, step sizes, stairs, decay settings, and momentum staying in [0, 1) for the whole run."""

    def k(name: str) -> str:
        return f"{prefix}.{name}"

    for name in ("cycle_min_lr", "cycle_max_lr"):
        value = getattr(cfg, name)
        if value is None:
            _fail(k(name), value, "must be set for one_cycle (the cycle's lr bounds: cycle_min_lr, cycle_max_lr)")
        _at_least(k(name), value, 0)
    _at_least(k("cycle_first_step_size"), cfg.cycle_first_step_size, 0, strict=True)
    # 0 is accepted, as DeepSpeed does: the lr climbs for cycle_first_step_size - 1 steps, then drops back to
    # cycle_min_lr at once (never reaching cycle_max_lr)
    if cfg.cycle_second_step_size is not None:
        _at_least(k("cycle_second_step_size"), cfg.cycle_second_step_size, 0)
    _at_least(k("cycle_first_stair_count"), cfg.cycle_first_stair_count, 0)
    if cfg.cycle_second_stair_count is not None:
        _at_least(k("cycle_second_stair_count"), cfg.cycle_second_stair_count, 0)
    _at_least(k("decay_step_size"), cfg.decay_step_size, 0)
    _at_least(k("decay_lr_rate"), cfg.decay_lr_rate, 0)
    if cfg.decay_lr_rate > 0 and cfg.decay_step_size == 0:  # DeepSpeed accepts it and skips the decay
        warnings.warn(f"{k('decay_lr_rate')}={cfg.decay_lr_rate} is ignored with {k('decay_step_size')}=0 (no "
                      "post-cycle decay, as in DeepSpeed); set decay_step_size > 0 to decay", stacklevel=4)
    if not cfg.cycle_momentum:
        return
    _in_unit(k("cycle_min_mom"), cfg.cycle_min_mom, include_one=False)
    _in_unit(k("cycle_max_mom"), cfg.cycle_max_mom, include_one=False)
    if cfg.decay_mom_rate != 0 and cfg.decay_step_size == 0:
        warnings.warn(f"{k('decay_mom_rate')}={cfg.decay_mom_rate} is ignored with {k('decay_step_size')}=0 (no "
                      "post-cycle decay, as in DeepSpeed); set decay_step_size > 0 to decay", stacklevel=4)
        return
    last = one_cycle_momentum(
        max(0, max_steps - 1), cycle_min_mom=cfg.cycle_min_mom, cycle_max_mom=cfg.cycle_max_mom,
        decay_mom_rate=cfg.decay_mom_rate, cycle_first_step_size=cfg.cycle_first_step_size,
        cycle_second_step_size=cfg.cycle_second_step_size, decay_step_size=cfg.decay_step_size,
    )
    if not 0.0 <= last < 1.0:
        _fail(
            k("decay_mom_rate"), cfg.decay_mom_rate,
            f"takes the momentum to {last:.4g} by step {max_steps - 1}; it must stay in [0, 1) "
            "(DeepSpeed's post-cycle momentum is cycle_max_mom * (1 + decay_mom_rate * t_after / decay_step_size))",
        )


def _check_range_test(cfg: LRRangeTestConfig, max_steps: int, prefix: str) -> None:
    """LRRangeTest's start, step size and rate."""
    _at_least(f"{prefix}.lr_range_test_min_lr", cfg.lr_range_test_min_lr, 0, strict=True)
    _at_least(f"{prefix}.lr_range_test_step_size", cfg.lr_range_test_step_size, 0, strict=True)
    _at_least(f"{prefix}.lr_range_test_step_rate", cfg.lr_range_test_step_rate, 0)


# The value checks of each option with DeepSpeed's keys (torch_step and custom: the signature check only).
_VALUE_CHECKS: dict[type, tuple[Callable[[Any, int, str], None], ...]] = {
    WarmupLRConfig: (_check_warmup, _check_warmup_bounds),
    WarmupDecayLRConfig: (_check_warmup, _check_total, _check_warmup_bounds, _check_total_after_warmup),
    WarmupCosineConfig: (_check_warmup, _check_total, _check_cosine_ratios),
    OneCycleConfig: (_check_one_cycle,),
    LRRangeTestConfig: (_check_range_test,),
}


def validate_lr_scheduler_config(cfg: LRSchedulerConfig, max_steps: int, prefix: str = "lr_scheduler") -> None:
    """Check the option's keys; raise ValueError naming the key, its value and what is valid.

    cfg must be an option's schema with its own name and keys; `_target_` must import to an
    LRScheduler class taking every key (its signature: what catches a typo in a `custom` option);
    then the values of DeepSpeed's schedules: warmup_type, step counts, ratios and the OneCycle
    bounds and decay settings. A null total_num_steps stands for max_steps.
    """
    check_option(cfg, "lr_scheduler", prefix)
    check_choice(f"{prefix}.step_alignment", cfg.step_alignment, STEP_ALIGNMENTS)
    _check_reserved(cfg, prefix)
    _check_target(cfg, _scheduler_target(cfg, max_steps, prefix), prefix)
    for check in _VALUE_CHECKS.get(type(cfg), ()):
        check(cfg, max_steps, prefix)


def non_closed_form_target(cfg: LRSchedulerConfig, prefix: str = "lr_scheduler") -> str | None:
    """cfg's `_target_` when it is not one of this module's closed-form schedules (None when it is).

    What needs the lr at an arbitrary step (`lrs_at`, e.g. random-LTD's layer-token schedule)
    can only use a ClosedFormLR.
    """
    return None if _is_closed_form(_target_class(cfg, prefix)) else cfg._target_


def build_lr_scheduler(cfg: LRSchedulerConfig, optimizer: torch.optim.Optimizer, max_steps: int) -> LRScheduler:
    """The configured schedule for `optimizer`, validated first; total_num_steps defaults to the run's max_steps.

    Built as `_target_(optimizer, **the option's other keys)` (Hydra's flat convention, `_partial_`).
    """
    validate_lr_scheduler_config(cfg, max_steps)
    target = _scheduler_target(cfg, max_steps, "lr_scheduler")
    try:
        return target(optimizer)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"lr_scheduler._target_={cfg._target_!r} with arguments {target.keywords} failed: {err}"
        ) from err
