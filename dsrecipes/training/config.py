"""Schemas of the engine's config groups trainer, precision, checkpoint and logger, and what the option groups share.

Plain dataclasses (no Hydra): they are the structured-config schemas of conf/<group>/*.yaml and the
config that `dsrecipes.initialize(config=...)` accepts from Python. Keys keep DeepSpeed's names where
DeepSpeed has one (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps,
gradient_clipping ...) and DeepSpeed's semantics (see docs/deepspeed.md, "Coming from DeepSpeed"). Fields
with a fixed set of values are Enums (dsrecipes.utils.config_enum.ConfigEnum), so a bad value fails at composition.

The optimizer and lr_scheduler groups have one schema per option, in their own modules
(dsrecipes.training.optim.optimizer_config, dsrecipes.training.optim.lr_scheduler_config); OPTION_SCHEMAS here
maps each option group to its options, and option_schema / check_option / to_dictconfig read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf

from dsrecipes.training.optim.lr_scheduler_config import LR_SCHEDULER_SCHEMAS
from dsrecipes.training.optim.optimizer_config import OPTIMIZER_SCHEMAS
from dsrecipes.training.option_schemas import ExtraArguments, _field_names, extra_keys
from dsrecipes.utils.compatibility_rows import Refusal, Supported
from dsrecipes.utils.config_enum import ConfigEnum, check_choice, config_enum, enum_values
from dsrecipes.utils.dtypes import DTYPE_NAMES
from dsrecipes.utils.inactive_rules import Inactive
from dsrecipes.utils.ranges import (
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_INT,
    SEED,
    above,
    at_least,
    between,
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
    eval_on_start: bool = False  # also evaluate before the first step (step 0), as transformers' Trainer can
    eval_batches: int = ranged(16, COUNT)  # validation micro-batches per evaluation; 0 = the whole split
    seed: int = ranged(1234, SEED)
    device: str = "auto"  # auto (cuda when present, else cpu) | cpu | cuda | cuda:N
    resume: str | None = None  # null = fresh start | auto = newest complete checkpoint if any | a path
    # for perf/mfu; null = known GPUs detected, else not logged
    peak_tflops: float | None = ranged(None, above(0, nullable=True, null_means="known GPUs detected, else MFU not logged"))
    # DeepSpeed's wall_clock_breakdown: perf/{data,forward,backward,grad_reduce,optimizer}_s per log interval
    # (dsrecipes.profiling.wall_clock); synchronises the device at every phase, so off by default
    wall_clock_breakdown: bool = False
    # DeepSpeed's dataloader_drop_last: the DataLoader dsrecipes.initialize(training_data=...) returns drops the last
    # partial micro-batch of each epoch (the recipe's own data pipeline yields whole micro-batches only)
    dataloader_drop_last: bool = False
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


class MasterDtype(ConfigEnum):
    """The dtype of the weights the optimizer steps with precision.master_weights=true: fp32 (a master copy beside
    the bf16/fp16 model) or bf16 (dtype bf16 only: no copy, the optimizer steps the bf16 weights and keeps its state
    in bf16, DeepSpeed's bf16.bf16_master_weights_and_grads with bf16_optimizer_states)."""

    fp32 = "fp32"
    bf16 = "bf16"


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
    master_dtype: MasterDtype = MasterDtype.fp32  # with master_weights: fp32 copies, or bf16 (the weights themselves)
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
        check_choice("logger.wandb_mode", self.wandb_mode, enum_values(WandbMode))


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
