"""Schemas of the engine's config groups: trainer, optimizer, lr_scheduler, precision, checkpoint, logger.

Plain dataclasses (no Hydra): they are the structured-config schemas of conf/<group>/*.yaml and the
config that `dsrecipes.initialize(config=...)` accepts from Python. Keys keep DeepSpeed's names where
DeepSpeed has one (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps,
gradient_clipping, warmup_num_steps, cos_min_ratio ...) and DeepSpeed's semantics
(see docs/deepspeed.md, "Coming from DeepSpeed"). Fields with a fixed set of values are Enums
(dsrecipes.utils.config_enum.ConfigEnum), so a bad value fails at composition.

The optimizer and lr_scheduler groups have one schema per option (AdamWConfig, SGDConfig, ...,
WarmupCosineConfig, OneCycleConfig, ...: OPTIMIZER_SCHEMAS / LR_SCHEDULER_SCHEMAS), so a key the
chosen option does not take fails at composition; their fixed-choice fields are Enums
(OptimizerImpl, WarmupType), so a bad value does too. Each names the class it builds in
`_target_`, its other keys being the class's arguments (built through dsrecipes.utils.instantiate).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING, DictConfig, OmegaConf

from dsrecipes.utils.compatibility_rows import Refusal, Supported
from dsrecipes.utils.config_enum import ConfigEnum, config_enum
from dsrecipes.utils.dtypes import DTYPE_NAMES
from dsrecipes.utils.inactive_rules import Inactive
from dsrecipes.utils.ranges import (
    ANY,
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_INT,
    SEED,
    UNIT,
    above,
    at_least,
    between,
    in_range,
    ranged,
)
from dsrecipes.utils.recipe_facts import RecipeFacts


def _positive(key: str, value, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}")



@dataclass
class TrainerConfig:
    """Run length, batch sizes (DeepSpeed's triple), clipping, intervals, seed and device.

    The batch triple counts only the keys that are set (not null), as DeepSpeed counts the keys of
    its config (dsrecipes.training.batch): any two of train_batch_size,
    train_micro_batch_size_per_gpu and gradient_accumulation_steps determine the third given the
    data-parallel world size, train_batch_size alone means accumulation 1 and micro = train // dp,
    the micro-batch alone means accumulation 1; all three must satisfy train = micro x accumulation
    x dp. So the three default to null. Difference from DeepSpeed: none set trains with 16 per rank
    and no accumulation (DeepSpeed asserts); gradient_accumulation_steps alone is a ValueError.
    """

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, t: t.sample_tokens == 0, lambda root, path: "trainer.sample_tokens=0 (no text sample at "
                 "the end)", keys=("sample_prompt", "sample_temperature", "sample_top_k")),
        Inactive(lambda root, t: t.sample_tokens > 0 and t.sample_temperature == 0, lambda root, path:
                 "trainer.sample_temperature=0 samples greedily", keys=("sample_top_k",)),
    )

    max_steps: int = ranged(600, POSITIVE_INT)
    train_batch_size: int | None = ranged(None, at_least(1, nullable=True, null_means="from the other batch keys"))
    # null + no other batch key = 16
    train_micro_batch_size_per_gpu: int | None = ranged(None, at_least(1, nullable=True, null_means="from the other batch keys"))
    gradient_accumulation_steps: int | None = ranged(None, at_least(1, nullable=True, null_means="from the other batch keys"))
    gradient_clipping: float = ranged(1.0, NON_NEGATIVE)  # global-norm clip; 0 disables (DeepSpeed's default is 1.0)
    log_interval: int = ranged(10, POSITIVE_INT)
    eval_interval: int = ranged(100, COUNT)  # 0 = only at the end
    eval_batches: int = ranged(16, COUNT)  # validation micro-batches per evaluation; 0 = the whole split
    seed: int = ranged(1234, SEED)
    device: str = "auto"  # auto (cuda when present, else cpu) | cpu | cuda | cuda:N
    resume: str | None = None  # null = fresh start | auto = newest complete checkpoint if any | a path
    # for perf/mfu; null = known GPUs detected, else not logged
    peak_tflops: float | None = ranged(None, above(0, nullable=True, null_means="known GPUs detected, else MFU not logged"))
    # DeepSpeed's wall_clock_breakdown: perf/{data,forward,backward,grad_reduce,optimizer}_s per log interval
    # (dsrecipes.profiling.wall_clock); synchronises the device at every phase, so off by default
    wall_clock_breakdown: bool = False
    progress_bar: bool = True
    sample_prompt: str = "def "
    sample_tokens: int = ranged(200, COUNT)  # 0 = no text sample at the end
    sample_temperature: float = ranged(0.8, NON_NEGATIVE)
    sample_top_k: int = ranged(40, COUNT)
    loss_curve: bool = True  # draw <run dir>/loss_curve.png at the end (needs matplotlib: the charts extra)

    CHECKED_BY_ENGINE: ClassVar[bool] = True  # dsrecipes.initialize checks it too (validate_engine_config)

    def check(self, facts: RecipeFacts) -> None:
        """The counts the loop runs by (the library path has no range check of its own)."""
        for key, allow_zero in (("max_steps", False), ("log_interval", False), ("eval_interval", True),
                                ("eval_batches", True), ("gradient_clipping", True), ("sample_tokens", True)):
            _positive(f"trainer.{key}", getattr(self, key), allow_zero)


# --------------------------------------------------------------------------------------------
# optimizer and lr_scheduler: one schema per option
# --------------------------------------------------------------------------------------------


class OptimizerImpl(ConfigEnum):
    """torch's kernels for an optimizer step: auto (fused when every parameter is on CUDA and the
    class has a working fused kernel, else foreach), or one of them forced."""

    auto = "auto"
    fused = "fused"
    foreach = "foreach"
    for_loop = "for_loop"


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


class ExtraArguments:
    """Mixin of the `custom` options: keys beyond the schema's fields are the class's own arguments.

    Their node accepts any key (flat, Hydra's convention); OmegaConf.to_object sets such keys as
    attributes, which land in the `extra_arguments` field. That field is hidden from OmegaConf
    (omegaconf_ignore) but is a real dataclass field, so dataclasses.replace and copy keep it.
    Reading an extra key as an attribute works too (`cfg.alpha`).
    """

    def __post_init__(self) -> None:
        # a copy: dataclasses.replace hands the original's dict to the new object
        object.__setattr__(self, "extra_arguments", dict(self.extra_arguments))

    def __setattr__(self, key: str, value: Any) -> None:
        if key in _field_names(type(self)):
            object.__setattr__(self, key, value)
        else:
            self.extra_arguments[key] = value

    def __getattr__(self, key: str) -> Any:
        extras = self.__dict__.get("extra_arguments")
        if extras is None or key.startswith("__") or key not in extras:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {key!r}")
        return extras[key]


def _field_names(cls: type) -> frozenset[str]:
    """The dataclass fields of cls (OmegaConf-hidden ones included)."""
    return frozenset(f.name for f in dataclasses.fields(cls))


def _extra_arguments_field() -> Any:
    """The hidden `extra_arguments` field of ExtraArguments schemas."""
    return field(default_factory=dict, metadata={"omegaconf_ignore": True})


def config_items(cfg: Any) -> dict[str, Any]:
    """Every key of an optimizer / lr_scheduler config object: its schema's fields, then any extra keys.

    Extra keys are the `custom` options' class arguments, or keys added to a fixed schema with
    Hydra's `+key=` (which validation rejects).
    """
    items = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "extra_arguments"}
    items.update(extra_keys(cfg))
    return items


def extra_keys(cfg: Any) -> dict[str, Any]:
    """The keys of cfg that are not fields of its schema."""
    if isinstance(cfg, ExtraArguments):
        return dict(cfg.extra_arguments)
    fields = _field_names(type(cfg))
    return {k: v for k, v in vars(cfg).items() if k not in fields}


def _tp_foreach(root, dims):
    impl = str(root.optimizer.impl)
    if dims.tp > 1 and impl in ("fused", "foreach"):
        return (f"parallel.tp={dims.tp} with optimizer.impl={impl}: tensor-parallel and replicated parameters "
                "cannot share one fused/foreach kernel; use optimizer.impl auto or for_loop")
    return None


_ONEBIT = ("onebitadam", "zerooneadam", "onebitlamb")


def _onebit_zero(root, dims):
    if root.optimizer.name in _ONEBIT and root.zero.stage >= 1:
        return (f"optimizer={root.optimizer.name} with zero.stage={root.zero.stage} is not supported: the 1-bit "
                "optimizers average the whole momentum themselves, which ZeRO's sharded optimizer states and "
                "gradients cannot give them (DeepSpeed refuses it too); use zero.stage=0")
    return None


def _onebit_model_parallel(root, dims):
    if root.optimizer.name not in _ONEBIT:
        return None
    for key, degree in (("parallel.tp", dims.tp), ("parallel.pp", dims.pp), ("parallel.sp", dims.sp),
                        ("moe.ep_size", dims.ep)):
        if degree > 1:
            return (f"optimizer={root.optimizer.name} with {key}={degree} is not supported yet: the onebit strategy "
                    "compresses plain data-parallel momentum only (untested with model-parallel layouts); use "
                    f"{key}=1 or optimizer=adam / lamb")
    return None


@dataclass
class OptimizerConfig:
    """Keys every optimizer option has; the base of the option schemas below (not an option itself).

    name is the option (conf/optimizer/<name>.yaml on the command line, the `name` key in a dict
    given to dsrecipes.initialize); _target_ is the class (or factory) built, by import path, with
    the option's other keys as its arguments (Hydra's flat convention). The engine itself reads
    name, impl and no_decay_bias_and_norm (never passed to the class) and applies weight_decay per
    parameter group (0 for biases, norm weights and other 1-D parameters when
    no_decay_bias_and_norm), also passing it to the class when the class takes it.
    """

    # how the group composes with the layouts and the other groups (dsrecipes.config.compatibility)
    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("tp with optimizer.impl fused/foreach", "DTensor and plain parameters cannot share one kernel; tp runs "
                "the optimizer's for-loop implementation", _tp_foreach),
        Refusal("1-bit optimizers with zero.stage >= 1", "they average the whole momentum themselves (DeepSpeed refuses "
                "it too)", _onebit_zero),
        Refusal("1-bit optimizers with tp / pp / sp / ep", "not implemented yet (plain data parallelism only)",
                _onebit_model_parallel),
    )

    name: str = MISSING
    _target_: str = MISSING
    lr: float = ranged(1e-3, POSITIVE)
    weight_decay: float = ranged(0.1, NON_NEGATIVE)
    impl: OptimizerImpl = OptimizerImpl.auto
    no_decay_bias_and_norm: bool = True

    CHECKED_BY_ENGINE: ClassVar[bool] = True  # dsrecipes.initialize checks it too (validate_engine_config)

    def check(self, facts: RecipeFacts) -> None:
        """The option's own checks (an unknown `name`, a key the option does not take, `custom`'s arguments)."""
        from dsrecipes.training.optim.optimizers import validate_optimizer_config

        validate_optimizer_config(self)


@dataclass
class AdamWConfig(OptimizerConfig):
    """optimizer=adamw (the default): torch.optim.AdamW, decoupled weight decay."""

    name: str = "adamw"
    _target_: str = "torch.optim.AdamW"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    amsgrad: bool = False


@dataclass
class AdamConfig(OptimizerConfig):
    """optimizer=adam, as DeepSpeed reads "Adam": adam_w_mode true (its default) builds AdamW
    (decoupled weight decay), false builds torch.optim.Adam (L2 weight decay in the gradient)."""

    name: str = "adam"
    _target_: str = "dsrecipes.training.optim.optimizers.adam"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    adam_w_mode: bool = True
    amsgrad: bool = False


@dataclass
class SGDConfig(OptimizerConfig):
    """optimizer=sgd: torch.optim.SGD; nesterov needs momentum > 0; weight decay is L2."""

    name: str = "sgd"
    _target_: str = "torch.optim.SGD"
    momentum: float = ranged(0.0, NON_NEGATIVE)
    nesterov: bool = False


@dataclass
class AdagradConfig(OptimizerConfig):
    """optimizer=adagrad: torch.optim.Adagrad; weight decay is L2."""

    name: str = "adagrad"
    _target_: str = "torch.optim.Adagrad"
    lr_decay: float = ranged(0.0, NON_NEGATIVE)
    eps: float = ranged(1e-8, NON_NEGATIVE)


@dataclass
class LambConfig(OptimizerConfig):
    """optimizer=lamb: DeepSpeed FusedLamb's update, the trust ratio ||p||/||u|| clamped to [min_coeff, max_coeff]."""

    name: str = "lamb"
    _target_: str = "dsrecipes.training.optim.lamb.Lamb"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    max_coeff: float = ranged(10.0, NON_NEGATIVE)
    min_coeff: float = ranged(0.01, NON_NEGATIVE)
    bias_correction: bool = True


@dataclass
class LionConfig(OptimizerConfig):
    """optimizer=lion: sign momentum (dsrecipes.training.optim.lion.Lion)."""

    name: str = "lion"
    _target_: str = "dsrecipes.training.optim.lion.Lion"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95], metadata=in_range(between(0, 1, high_open=True)))


@dataclass
class OneBitAdamConfig(OptimizerConfig):
    """optimizer=onebitadam: DeepSpeed's OnebitAdam (DeepSpeed <= 0.19.6; dsrecipes.training.optim.onebit_adam): Adam
    for freeze_step updates, then the variance frozen and the momentum averaged by a 1-bit compressed all-reduce
    (the `onebit` data-parallel strategy). bias_correction false is DeepSpeed's update (its flag is unused)."""

    name: str = "onebitadam"
    _target_: str = "dsrecipes.training.optim.onebit_adam.OneBitAdam"
    weight_decay: float = ranged(0.0, NON_NEGATIVE)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    freeze_step: int = ranged(100000, POSITIVE_INT)  # at least one uncompressed warm-up update
    bias_correction: bool = False


@dataclass
class ZeroOneAdamConfig(OptimizerConfig):
    """optimizer=zerooneadam: DeepSpeed's ZeroOneAdam (DeepSpeed <= 0.19.6; dsrecipes.training.optim.zero_one_adam):
    variance updated at exponentially spaced steps until var_freeze_step, 1-bit compressed gradients in between,
    then local steps with 1-bit momentum syncs at intervals growing up to local_step_clipper."""

    name: str = "zerooneadam"
    _target_: str = "dsrecipes.training.optim.zero_one_adam.ZeroOneAdam"
    weight_decay: float = ranged(0.0, NON_NEGATIVE)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    var_freeze_step: int = ranged(100000, COUNT)
    var_update_scaler: int = ranged(16, POSITIVE_INT)
    local_step_scaler: int = ranged(32678, POSITIVE_INT)
    local_step_clipper: int = ranged(16, POSITIVE_INT)
    bias_correction: bool = False


@dataclass
class OneBitLambConfig(OptimizerConfig):
    """optimizer=onebitlamb: DeepSpeed's OnebitLamb (DeepSpeed <= 0.19.6; dsrecipes.training.optim.onebit_lamb): LAMB
    for freeze_step updates, then frozen (averaged) trust coefficients scaled by a bounded factor and the
    momentum averaged by a 1-bit compressed all-reduce."""

    name: str = "onebitlamb"
    _target_: str = "dsrecipes.training.optim.onebit_lamb.OneBitLamb"
    weight_decay: float = ranged(0.0, NON_NEGATIVE)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    freeze_step: int = ranged(100000, POSITIVE_INT)  # at least one uncompressed warm-up update
    max_coeff: float = ranged(10.0, NON_NEGATIVE)
    min_coeff: float = ranged(0.01, NON_NEGATIVE)
    coeff_beta: float = ranged(0.9, between(0, 1, high_open=True))
    factor_max: float = ranged(4.0, POSITIVE)
    factor_min: float = ranged(0.5, POSITIVE)
    factor_threshold: float = ranged(0.1, between(0, 1, high_open=True))
    bias_correction: bool = False
    refresh_scaling: bool = True  # recompute the momentum scaling coefficients every compressed step (False: DeepSpeed's)


@dataclass
class RMSpropConfig(OptimizerConfig):
    """optimizer=rmsprop: a plain torch.optim class as an option (its arguments as keys)."""

    name: str = "rmsprop"
    _target_: str = "torch.optim.RMSprop"
    weight_decay: float = ranged(0.0, NON_NEGATIVE)
    alpha: float = ranged(0.99, NON_NEGATIVE)
    eps: float = ranged(1e-8, NON_NEGATIVE)
    momentum: float = ranged(0.0, NON_NEGATIVE)
    centered: bool = False


@dataclass
class CustomOptimizerConfig(ExtraArguments, OptimizerConfig):
    """optimizer=custom: any optimizer class by import path, with its constructor arguments as flat keys.

    `optimizer=custom optimizer._target_=torch.optim.NAdam optimizer.momentum_decay=0.004`: keys
    beyond the shared ones go to the class; each is checked against its signature before any
    work starts, so a misspelled one fails naming it and the class's arguments.
    """

    name: str = "custom"
    weight_decay: float = ranged(0.0, NON_NEGATIVE)
    extra_arguments: dict[str, Any] = _extra_arguments_field()


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


# The options of each group (conf/<group>/<name>.yaml extends `<name>_schema`), default first.
OPTIMIZER_SCHEMAS: dict[str, type] = {
    cls.name: cls
    for cls in (AdamWConfig, AdamConfig, SGDConfig, AdagradConfig, LambConfig, LionConfig, RMSpropConfig,
                OneBitAdamConfig, ZeroOneAdamConfig, OneBitLambConfig, CustomOptimizerConfig)
}
LR_SCHEDULER_SCHEMAS: dict[str, type] = {
    cls.name: cls
    for cls in (WarmupCosineConfig, WarmupLRConfig, WarmupDecayLRConfig, OneCycleConfig, LRRangeTestConfig,
                ConstantConfig, TorchStepConfig, CustomLRSchedulerConfig)
}
OPTION_SCHEMAS: dict[str, dict[str, type]] = {"optimizer": OPTIMIZER_SCHEMAS, "lr_scheduler": LR_SCHEDULER_SCHEMAS}


def option_schema(group: str, name: str | None) -> type:
    """The schema of option `name` of `group` (optimizer / lr_scheduler); None = the group's default.

    Raises ValueError naming `<group>.name` and the valid options for an unknown name.
    """
    schemas = OPTION_SCHEMAS[group]
    if name is None:
        return next(iter(schemas.values()))
    if name not in schemas:
        raise ValueError(f"{group}.name={name!r} is not valid; choose one of: {', '.join(schemas)}")
    return schemas[name]


def check_option(cfg: Any, group: str, prefix: str) -> None:
    """ValueError unless cfg is an option's schema whose `name` is that option and which holds only its own keys.

    A fixed schema gets extra keys only through Hydra's `+key=value` (OmegaConf lets it add one);
    they would be silently ignored or passed to a class that does not take them.
    """
    schemas = OPTION_SCHEMAS[group]
    option = next((name for name, cls in schemas.items() if type(cfg) is cls), None)
    if option is None:
        raise ValueError(
            f"{prefix}: {type(cfg).__name__} is not the schema of a {group} option; use one of "
            f"{', '.join(cls.__name__ for cls in schemas.values())}"
        )
    if cfg.name != option:
        if cfg.name in schemas:
            hint = f"choose the option itself: {group}={cfg.name} on the command line, or `name` in a dict"
        else:
            hint = f"the options are: {', '.join(schemas)}"
        raise ValueError(
            f"{prefix}.name={cfg.name!r} does not match the option this config was built from, {option!r} "
            f"({type(cfg).__name__}); {hint}"
        )
    if isinstance(cfg, ExtraArguments):
        return
    extras = extra_keys(cfg)
    if extras:
        key = next(iter(extras))
        keys = ", ".join(k for k in _field_names(type(cfg)) if k != "extra_arguments")
        raise ValueError(
            f"{prefix}.{key} is not a key of {group} option {option!r} ({type(cfg).__name__}: {keys}); "
            f"for a class's own arguments use {group}=custom"
        )


# dtype names from the one table of them (dsrecipes.utils.dtypes): fp32, bf16, fp16; auto resolves to one of
# them for the run's device (dsrecipes.training.precision.resolve_auto_precision)
PrecisionDtype = config_enum("PrecisionDtype", [*DTYPE_NAMES, "auto"], __name__)


class NonfiniteGrads(ConfigEnum):
    """What an fp32/bf16 step with inf/nan gradients does: stop the run naming the step, or skip it."""

    error = "error"
    skip = "skip"


# the keys of DeepSpeed's fp16 block: loss scaling, static or dynamic
_FP16_KEYS = ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
              "min_loss_scale", "raise_error_at_min_scale")
_DYNAMIC_SCALE_KEYS = _FP16_KEYS[1:]


def _tp_masters(root, dims):
    if dims.tp > 1 and root.precision.master_weights and dims.dp == 1:
        return (f"parallel.tp={dims.tp} with precision.master_weights=true is not supported; use precision=bf16 "
                "(autocast over fp32 parameters)")
    return None


@dataclass
class PrecisionConfig:
    """Numeric precision. Keys of the fp16 part keep DeepSpeed's names and defaults (its `fp16` block).

    dtype fp32; bf16 or fp16 either as autocast over fp32 weights (master_weights=false) or with the
    model itself in bf16/fp16 and fp32 master weights in the optimizer (master_weights=true, what
    DeepSpeed's fp16/bf16 optimizers do). fp16 scales the loss: loss_scale=0 is dynamic
    (initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis, min_loss_scale),
    loss_scale>0 is a static scale. An overflowing fp16 step is skipped and the scale adjusted;
    reaching min_loss_scale raises unless raise_error_at_min_scale=false (then warn and keep skipping).
    In fp32/bf16, inf/nan gradients stop the run naming the step (nonfinite_grads=error) or skip the
    step (nonfinite_grads=skip). Skipped steps are counted (train/skipped_steps) on every rank together.
    """

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, p: p.dtype != "fp16", lambda root, path: f"loss scaling is fp16's and "
                 f"precision.dtype={root.precision.dtype}", keys=_FP16_KEYS),
        Inactive(lambda root, p: p.dtype == "fp16" and p.loss_scale > 0, lambda root, path: "these tune dynamic loss "
                 f"scaling and precision.loss_scale={root.precision.loss_scale} is a static scale (0 = dynamic)",
                 keys=_DYNAMIC_SCALE_KEYS),
        Inactive(lambda root, p: p.dtype == "fp16", lambda root, path: "fp16 skips overflowing steps through its loss "
                 "scaler (nonfinite_grads is for fp32/bf16)", keys=("nonfinite_grads",)),
    )

    # how the group composes with the layouts and the other groups (dsrecipes.config.compatibility)
    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("tp with fp32 master weights at dp 1", "not implemented yet (use precision=bf16)", _tp_masters),
    )

    dtype: PrecisionDtype = PrecisionDtype.fp32  # fp32 | bf16 | fp16 | auto (bf16 where the device is fast at it)
    master_weights: bool = False
    loss_scale: float = ranged(0.0, NON_NEGATIVE)
    initial_scale_power: int = ranged(16, between(0, 127))  # 2**power must be a finite fp32 number
    loss_scale_window: int = ranged(1000, POSITIVE_INT)
    hysteresis: int = ranged(2, POSITIVE_INT)
    consecutive_hysteresis: bool = False
    min_loss_scale: float = ranged(1.0, POSITIVE)
    raise_error_at_min_scale: bool = True
    nonfinite_grads: NonfiniteGrads = NonfiniteGrads.error  # error | skip (fp32/bf16)
    # DeepSpeed's fp16.auto_cast (dtype fp16 only): the engine casts the floating tensors its forward is given to
    # fp16, as DeepSpeed's engine does, so a model whose first op is a norm of fp32 inputs gets fp16 inputs
    auto_cast: bool = False

    CHECKED_BY_ENGINE: ClassVar[bool] = True  # dsrecipes.initialize checks it too (validate_engine_config)

    def check(self, facts: RecipeFacts) -> None:
        """fp16 on a CPU is told what it gets; then the group's own checks."""
        from dsrecipes.training.precision import validate_precision_config, warn_fp16_on_cpu

        warn_fp16_on_cpu(self, facts.root.trainer.device, facts.device)
        validate_precision_config(self)


@dataclass
class CheckpointConfig:
    """Where and when the engine saves. Checkpoints go to <run dir>/<dirname>/step_N/."""

    dirname: str = "checkpoints"
    interval: int = ranged(0, COUNT)  # save every N optimizer steps; 0 = only the final checkpoint
    keep_last: int = ranged(3, COUNT)  # keep the newest K complete checkpoints; 0 = keep all
    save_final: bool = True
    export_safetensors: bool = True  # also export the final model to <run dir>/export/ (safetensors + config)

    CHECKED_BY_ENGINE: ClassVar[bool] = True  # dsrecipes.initialize checks it too (validate_engine_config)

    def check(self, facts: RecipeFacts) -> None:
        """When and how many checkpoints: counts, 0 meaning off / keep all."""
        _positive("checkpoint.interval", self.interval, allow_zero=True)
        _positive("checkpoint.keep_last", self.keep_last, allow_zero=True)


class WandbMode(ConfigEnum):
    """logger.wandb_mode: auto = online when WANDB_API_KEY is set, else offline."""

    auto = "auto"
    offline = "offline"
    online = "online"
    disabled = "disabled"


class LogLevel(ConfigEnum):
    """logger.level: the standard logging level names."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


@dataclass
class LoggerConfig:
    """Metric sinks, any combination: jsonl -> metrics.jsonl, tensorboard -> tb/, wandb -> wandb/.

    W&B runs offline (never touching the network) unless WANDB_API_KEY is set or wandb_mode=online;
    it logs the resolved config, names the run after the recipe's `name` and groups multirun jobs.
    """

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, logger: not logger.wandb, lambda root, path: "logger.wandb=false (choose logger=wandb or "
                 "logger=all)", keys=("wandb_project", "wandb_entity", "wandb_mode", "wandb_tags", "wandb_group")),
    )

    jsonl: bool = True
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "dsrecipes"
    wandb_entity: str | None = None
    wandb_mode: WandbMode = WandbMode.auto  # auto (online iff WANDB_API_KEY is set) | offline | online | disabled
    wandb_tags: list[str] = field(default_factory=list)
    wandb_group: str | None = None  # null = the multirun sweep's name for sweep jobs, else none
    level: LogLevel = LogLevel.INFO  # the `dsrecipes` logger's level (console and logs/rank<R>.log)

    def check(self, facts: RecipeFacts) -> None:
        """wandb_mode against its choices (a dict given to dsrecipes.initialize skips the Enum's check)."""
        modes = [m.value for m in WandbMode]
        if self.wandb_mode not in modes:
            raise ValueError(f"logger.wandb_mode={self.wandb_mode!r} is not valid; choose one of: {', '.join(modes)}")


def to_dictconfig(root: Any) -> DictConfig:
    """A typed DictConfig of a recipe object (a RootConfig), keeping the extra keys of a `custom`
    optimizer / lr_scheduler, which OmegaConf.structured(root) alone drops (they are not schema fields)."""
    node = OmegaConf.structured(root)
    for group in OPTION_SCHEMAS:
        option = getattr(root, group)
        if isinstance(option, ExtraArguments):
            OmegaConf.set_struct(node[group], False)
        for key, value in extra_keys(option).items():
            node[group][key] = value
    return node
