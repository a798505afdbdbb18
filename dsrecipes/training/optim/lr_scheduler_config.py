"""The `lr_scheduler` group: one schema per option (DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR /
OneCycle / LRRangeTest, constant, torch's StepLR, `custom`), their valid ranges, "set but ignored" rules and checks.
Keys keep DeepSpeed's names and semantics; the schedules themselves are dsrecipes.training.optim.lr_schedules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import MISSING

from dsrecipes.training.option_schemas import ExtraArguments, _extra_arguments_field
from dsrecipes.utils.config_enum import ConfigEnum
from dsrecipes.utils.inactive_rules import Inactive
from dsrecipes.utils.ranges import (
    ANY,
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_INT,
    UNIT,
    above,
    at_least,
    between,
    ranged,
)
from dsrecipes.utils.recipe_facts import RecipeFacts


class WarmupType(ConfigEnum):
    """DeepSpeed's warmup curves: log(t+1)/log(N) (its default) or t/N."""

    linear = "linear"
    log = "log"


class StepAlignment(ConfigEnum):
    """Which schedule value an optimizer step uses (lr_scheduler.step_alignment).

    dsrecipes: the k-th optimizer step (0-based) uses f(k), f(0) being installed when the schedule
    is built (torch's LRScheduler convention). deepspeed: DeepSpeed's engine exactly - the first
    step uses the placeholder its schedule objects install at construction (see LRSchedulerConfig)
    and step k >= 1 uses f(k - 1), one step behind.
    """

    dsrecipes = "dsrecipes"
    deepspeed = "deepspeed"


@dataclass
class LRSchedulerConfig:
    """Keys every lr_scheduler option has; the base of the option schemas below (not an option itself).

    name is the option, _target_ the scheduler class, built as _target_(optimizer, **other keys);
    it is stepped once per applied (not skipped) optimizer step. The schedules keep DeepSpeed's key
    names, defaults and formulas f(t). A null total_num_steps means trainer.max_steps; a null
    warmup_max_lr means each param group's own lr.

    step_alignment (dsrecipes | deepspeed) says which value of f an optimizer step uses:

    * dsrecipes (the default): optimizer step k (0-based) uses f(k); building the schedule installs
      f(0), as torch's schedulers do. Every step, the first included, gets the formula's value.
    * deepspeed: DeepSpeed's engine exactly. Its schedule objects (deepspeed/runtime/lr_schedules.py)
      start at last_batch_iteration = -1 and install a placeholder; the engine calls step() after
      each applied optimizer step, so step 0 uses the placeholder and step k >= 1 uses f(k - 1),
      i.e. each value one step later than with dsrecipes. The placeholders: warmup_min_lr
      (warmup_lr, warmup_decay_lr), 0 (warmup_cosine), cycle_min_lr and momentum cycle_min_mom
      (one_cycle), lr_range_test_min_lr (lr_range_test). A DeepSpeed-config import sets this.

    The default stays dsrecipes deliberately: DeepSpeed's first step runs at a value its formula
    never produces there (warmup_cosine: lr 0, a step that moves Adam's moments but no weight),
    and the whole schedule lags by one step. constant, torch_step and custom torch schedulers are
    the same under both (DeepSpeed steps a torch scheduler with torch's own convention, which is
    dsrecipes'); a custom `_target_` that is one of dsrecipes' schedules gets the key passed on.
    """

    name: str = MISSING
    _target_: str = MISSING
    step_alignment: StepAlignment = StepAlignment.dsrecipes

    CHECKED_BY_ENGINE: ClassVar[bool] = True  # dsrecipes.initialize checks it too (validate_engine_config)

    def check(self, facts: RecipeFacts) -> None:
        """The option's own checks, against the run's length."""
        from dsrecipes.training.optim.lr_schedules import validate_lr_scheduler_config

        validate_lr_scheduler_config(self, facts.root.trainer.max_steps)


@dataclass
class ConstantConfig(LRSchedulerConfig):
    """lr_scheduler=constant: the optimizer's lr for the whole run."""

    name: str = "constant"
    _target_: str = "dsrecipes.training.optim.lr_schedules.ConstantSchedule"


@dataclass
class WarmupKeys(LRSchedulerConfig):
    """The warmup keys of DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR.

    warmup_num_steps must be >= 1, as in DeepSpeed (0 is its ValueError); the schedules use
    N = max(2, warmup_num_steps), so 1 behaves as 2.
    """

    warmup_num_steps: int = ranged(1000, POSITIVE_INT)
    warmup_type: WarmupType = WarmupType.log


@dataclass
class WarmupLRConfig(WarmupKeys):
    """lr_scheduler=warmup_lr: DeepSpeed WarmupLR, warmup_min_lr -> warmup_max_lr, then constant."""

    name: str = "warmup_lr"
    _target_: str = "dsrecipes.training.optim.lr_schedules.WarmupLR"
    warmup_min_lr: float = ranged(0.0, NON_NEGATIVE)
    warmup_max_lr: float | None = ranged(None, above(0, nullable=True, null_means="the optimizer's lr"))


@dataclass
class WarmupDecayLRConfig(WarmupLRConfig):
    """lr_scheduler=warmup_decay_lr: DeepSpeed WarmupDecayLR, WarmupLR's warmup then linear decay.

    A total_num_steps below the warmup is accepted with a warning, as DeepSpeed does (the lr then
    falls to warmup_min_lr right after the warmup). Deliberate difference: a null (absent)
    warmup_max_lr is each param group's lr, as in WarmupLR; DeepSpeed 0.19.8's WarmupDecayLR
    signature still defaults it to 0.001, the fallback DeepSpeed itself called a bug and removed
    from WarmupLR (PR #7360, "WarmupLR inherits optimizer lr when not specified"). For DeepSpeed's
    number, set warmup_max_lr=0.001.
    """

    name: str = "warmup_decay_lr"
    _target_: str = "dsrecipes.training.optim.lr_schedules.WarmupDecayLR"
    total_num_steps: int | None = ranged(None, at_least(1, nullable=True, null_means="trainer.max_steps"))


@dataclass
class WarmupCosineConfig(WarmupKeys):
    """lr_scheduler=warmup_cosine (the default): DeepSpeed WarmupCosineLR, ratios of the optimizer's lr.

    A total_num_steps below the warmup is accepted, as DeepSpeed does (the ratio then stays at
    cos_min_ratio after the warmup; DeepSpeed logs a warning, dsrecipes does not).
    """

    name: str = "warmup_cosine"
    _target_: str = "dsrecipes.training.optim.lr_schedules.WarmupCosineLR"
    total_num_steps: int | None = ranged(None, at_least(1, nullable=True, null_means="trainer.max_steps"))
    warmup_min_ratio: float = ranged(0.0, UNIT)
    cos_min_ratio: float = ranged(0.0001, UNIT)


@dataclass
class OneCycleConfig(LRSchedulerConfig):
    """lr_scheduler=one_cycle: DeepSpeed OneCycle, lr min -> max -> min (momentum the reverse), then decay.

    As DeepSpeed: cycle_second_step_size=0 is accepted (the lr climbs, then drops straight back),
    and decay_lr_rate / decay_mom_rate with decay_step_size=0 are ignored (with a warning here).
    Differences, kept deliberately: the optimizer's beta2 is kept (DeepSpeed overwrites betas with
    (momentum, 0.99) for the whole run: set the optimizer's beta2 to 0.99 to match); SGD / RMSprop
    `momentum` is cycled (DeepSpeed only cycles `betas` and disables cycle_momentum for other
    optimizers, warning that they do not support momentum: set cycle_momentum=false to match); a
    decay_mom_rate that takes the momentum out of [0, 1) within trainer.max_steps is rejected
    (DeepSpeed would run with beta1 >= 1).
    """

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, s: s.cycle_momentum is False, lambda root, path: "lr_scheduler.cycle_momentum=false "
                 "(one_cycle)", keys=("cycle_min_mom", "cycle_max_mom", "decay_mom_rate")),
    )

    name: str = "one_cycle"
    _target_: str = "dsrecipes.training.optim.lr_schedules.OneCycle"
    cycle_min_lr: float | None = ranged(None, at_least(0, nullable=True, null_means="unset; one_cycle requires it"))  # required
    cycle_max_lr: float | None = ranged(None, at_least(0, nullable=True, null_means="unset; one_cycle requires it"))  # required
    decay_lr_rate: float = ranged(0.0, NON_NEGATIVE)
    cycle_first_step_size: int = ranged(2000, POSITIVE_INT)
    cycle_second_step_size: int | None = ranged(None, at_least(0, nullable=True, null_means="cycle_first_step_size"))
    cycle_first_stair_count: int = ranged(0, COUNT)
    cycle_second_stair_count: int | None = ranged(None, at_least(0, nullable=True, null_means="cycle_first_stair_count"))
    decay_step_size: int = ranged(0, COUNT)
    cycle_momentum: bool = True
    cycle_min_mom: float = ranged(0.8, between(0, 1, high_open=True))
    cycle_max_mom: float = ranged(0.9, between(0, 1, high_open=True))
    decay_mom_rate: float = ranged(0.0, ANY)  # checked against the run length by the one_cycle validator


@dataclass
class LRRangeTestConfig(LRSchedulerConfig):
    """lr_scheduler=lr_range_test: DeepSpeed LRRangeTest, lr growing linearly (or in stairs) from its min."""

    name: str = "lr_range_test"
    _target_: str = "dsrecipes.training.optim.lr_schedules.LRRangeTest"
    lr_range_test_min_lr: float = ranged(1e-3, POSITIVE)
    lr_range_test_step_size: int = ranged(2000, POSITIVE_INT)
    lr_range_test_step_rate: float = ranged(1.0, NON_NEGATIVE)
    lr_range_test_staircase: bool = False


@dataclass
class TorchStepConfig(LRSchedulerConfig):
    """lr_scheduler=torch_step: torch.optim.lr_scheduler.StepLR, a plain torch scheduler as an option."""

    name: str = "torch_step"
    _target_: str = "torch.optim.lr_scheduler.StepLR"
    step_size: int = ranged(MISSING, POSITIVE_INT)
    gamma: float = ranged(0.1, POSITIVE)


@dataclass
class CustomLRSchedulerConfig(ExtraArguments, LRSchedulerConfig):
    """lr_scheduler=custom: any scheduler class by import path, its constructor arguments as flat keys.

    `lr_scheduler=custom lr_scheduler._target_=torch.optim.lr_scheduler.ExponentialLR
    lr_scheduler.gamma=0.999`: each key is checked against the class's signature before any work starts.
    """

    name: str = "custom"
    extra_arguments: dict[str, Any] = _extra_arguments_field()
LR_SCHEDULER_SCHEMAS: dict[str, type] = {
    cls.name: cls
    for cls in (WarmupCosineConfig, WarmupLRConfig, WarmupDecayLRConfig, OneCycleConfig, LRRangeTestConfig,
                ConstantConfig, TorchStepConfig, CustomLRSchedulerConfig)
}
