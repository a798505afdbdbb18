"""The ``data_efficiency`` config group: curriculum learning and random-LTD, DeepSpeed's key names, flattened.

Plain dataclasses (OmegaConf-friendly field types) that double as the Hydra schema of
``conf/data_efficiency/*.yaml`` and as a Python config:

    data_efficiency:
      seed: 1234
      curriculum_learning: {enabled, metric: seqlen|vocab_rarity|"pkg.mod:fn", seqlen_mode: truncate|pack,
                            difficulty_type: value|percentile, min_difficulty, max_difficulty,
                            schedule_type, total_curriculum_step, difficulty_step, root_degree,
                            difficulty, max_step, custom_fn}
      random_ltd: {enabled, random_ltd_layer_id, min_value, max_value, require_steps, seq_per_step,
                   layer_token_lr_schedule}

``metric: seqlen`` is DeepSpeed's legacy sequence-length curriculum (batches are cut to the current
difficulty); any other metric is a metric-based curriculum (the data analyzer scores every sample, the
`CurriculumSampler` draws within the current difficulty). ``custom_fn`` is an import path ``"pkg.mod:fn"`` or
a mapping ``{_target_: pkg.mod.fn, **kwargs}`` (kwargs bound with functools.partial).

``schedule_type``, ``difficulty_type`` and ``seqlen_mode`` are Enums (ScheduleType, DifficultyType,
SeqlenMode, built from the library's SCHEDULE_TYPES / DIFFICULTY_TYPES / SEQLEN_MODES), so a bad value
fails at composition naming the key and the choices; ``metric`` stays a string (it may be an import
path). The Enums are dsrecipes' one ConfigEnum (dsrecipes.utils.config_enum, a standard-library-only
module and the one thing of dsrecipes this library imports): a member is its string in comparisons, dict
keys, f-strings and json. Python users may pass plain strings; the validator checks them.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from dsrecipes.utils.compatibility_rows import Refusal, Supported
from dsrecipes.utils.config_enum import config_enum
from dsrecipes.utils.inactive_rules import Inactive, switched_off
from dsrecipes.utils.ranges import POSITIVE_INT, SEED, Range, above, at_least, ranged
from dsrecipes.utils.recipe_facts import RecipeFacts

from .curriculum import (
    DIFFICULTY_TYPES,
    SCHEDULE_TYPES,
    SEQLEN_MODES,
    CurriculumConfig,
    CurriculumScheduler,
    resolve_custom_fn,
)

# .analyzer (numpy) and .random_ltd (torch) are imported in the functions that use them: the recipe schema
# (RootConfig's `data_efficiency` field) imports this module when `python -m dsrecipes --help` composes.
if TYPE_CHECKING:
    from .random_ltd import RandomLTDScheduler

__all__ = ["CurriculumLearningConfig", "DataEfficiencyConfig", "DifficultyType", "RandomLTDConfig",
           "ScheduleType", "SeqlenMode", "build_curriculum_scheduler", "build_random_ltd_scheduler",
           "validate_data_efficiency_config"]





def _plain(value: Any) -> Any:
    """An Enum member's plain value (what the library objects and their state dicts hold)."""
    return value.value if isinstance(value, Enum) else value


ScheduleType = config_enum("ScheduleType", SCHEDULE_TYPES, __name__)  # fixed_linear | fixed_root | fixed_discrete | custom
DifficultyType = config_enum("DifficultyType", DIFFICULTY_TYPES, __name__)  # value | percentile
SeqlenMode = config_enum("SeqlenMode", SEQLEN_MODES, __name__)  # truncate | pack


@dataclass
class CurriculumLearningConfig:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        switched_off(),
    )

    enabled: bool = False
    metric: str = "seqlen"  # seqlen (cut batches) | vocab_rarity | an import path "pkg.mod:fn(tokens) -> float"
    seqlen_mode: SeqlenMode = SeqlenMode.truncate  # metric=seqlen: truncate | pack
    difficulty_type: DifficultyType = DifficultyType.value  # metric curriculum: value | percentile
    min_difficulty: int | None = ranged(None, Range(nullable=True))
    # metric=seqlen: null = data.block_size
    max_difficulty: int | None = ranged(None, Range(nullable=True, null_means="data.block_size for seqlen"))
    schedule_type: ScheduleType = ScheduleType.fixed_linear  # fixed_linear | fixed_root | fixed_discrete | custom
    total_curriculum_step: int | None = ranged(None, at_least(1, nullable=True))
    difficulty_step: int | None = ranged(None, at_least(1, nullable=True))
    root_degree: float | None = ranged(None, above(0, nullable=True))
    difficulty: list[int] | None = ranged(None, Range(nullable=True))
    max_step: list[int] | None = ranged(None, at_least(0, nullable=True))
    custom_fn: Any = None  # "pkg.mod:fn" or {_target_: pkg.mod.fn, ...kwargs}


@dataclass
class RandomLTDConfig:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        switched_off(),
    )

    enabled: bool = False
    random_ltd_layer_id: list[int] | None = ranged(
        None, at_least(0, nullable=True, null_means="every layer but the first and last"))
    min_value: int = ranged(32, POSITIVE_INT)  # kept tokens per sequence at step 0
    max_value: int | None = ranged(None, at_least(1, nullable=True, null_means="data.block_size"))  # null = data.block_size
    require_steps: int = ranged(200, POSITIVE_INT)  # steps to grow from min_value to max_value
    seq_per_step: int = ranged(16, POSITIVE_INT)  # kept length is a multiple of this
    layer_token_lr_schedule: bool = False  # drive the LR schedule by consumed layer-tokens


def _random_ltd(root) -> bool:
    return bool(root.data_efficiency.random_ltd.enabled)


def _seqlen_curriculum(root) -> bool:
    cl = root.data_efficiency.curriculum_learning
    return bool(cl.enabled and cl.metric == "seqlen")


def _sp_random_ltd(root, dims):
    if dims.sp > 1 and _random_ltd(root):
        return (f"data_efficiency.random_ltd.enabled=true is not supported with parallel.sp={dims.sp}: token "
                "dropping would drop different tokens in each sequence chunk; use parallel.sp=1 or disable random-LTD")
    return None


def _sp_seqlen(root, dims):
    if dims.sp > 1 and _seqlen_curriculum(root):
        return (f"data_efficiency.curriculum_learning.metric=seqlen is not supported with parallel.sp={dims.sp}: it "
                "changes the sequence length per step, which must stay divisible by parallel.sp; use parallel.sp=1")
    return None


def _tp_random_ltd(root, dims):
    if dims.tp > 1 and _random_ltd(root):
        return f"parallel.tp={dims.tp} with data_efficiency.random_ltd.enabled=true is not supported yet"
    return None


    return None


@dataclass
class DataEfficiencyConfig:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, d: not (d.curriculum_learning.enabled or d.random_ltd.enabled),
                 lambda root, path: "no data_efficiency technique is enabled", keys=("seed",)),
    )

    # how the group composes with the layouts and the other groups (dsrecipes.config.compatibility)
    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("sp with random-LTD", "each sequence chunk would drop different tokens", _sp_random_ltd),
        Refusal("sp with the sequence-length curriculum", "the length must stay divisible by sp", _sp_seqlen),
        Refusal("tp with random-LTD", "not implemented yet", _tp_random_ltd),
        Supported("pp with random-LTD and the sequence-length curriculum", "supported: per-layer random-LTD draws (the "
                  "schedule's shape inference takes none), one pipeline schedule per batch shape", ("pp2-data_efficiency",)),
    )

    seed: int = ranged(1234, SEED)
    curriculum_learning: CurriculumLearningConfig = field(default_factory=CurriculumLearningConfig)
    random_ltd: RandomLTDConfig = field(default_factory=RandomLTDConfig)

    def check(self, facts: RecipeFacts) -> None:
        """The group's own checks, against the model's blocks, the data's block and the lr schedule.

        A Hugging Face module (model.style=hf) has no dsrecipes blocks to drop tokens between: its compatibility row
        refuses random-LTD with that true reason, so the layer ids are not checked against its layers here.
        """
        if str(facts.root.model.style) == "hf" and self.random_ltd.enabled:
            return
        validate_data_efficiency_config(self, facts.root.model.n_layer, facts.root.data.block_size,
                                        lr_scheduler_target=facts.lr_scheduler_target())


def _custom_fn(spec: Any, key: str):
    if spec is None:
        return None
    if hasattr(spec, "items"):  # {_target_: ..., kwargs}
        spec = dict(spec.items())
        target = spec.pop("_target_", None)
        spec.pop("_partial_", None)
        if not target:
            raise ValueError(f"{key}={spec!r}: a mapping needs _target_ (a dotted path to a function)")
        try:
            fn = resolve_custom_fn(target)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from exc
        return functools.partial(fn, **spec) if spec else fn
    try:
        return resolve_custom_fn(spec)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from exc


def build_curriculum_scheduler(cfg: CurriculumLearningConfig, block_size: int | None = None,
                               prefix: str = "data_efficiency.curriculum_learning") -> CurriculumScheduler:
    """The scheduler of ``cfg``; ValueError naming ``prefix.<key>`` for a bad or missing key."""
    max_difficulty = cfg.max_difficulty
    if max_difficulty is None and cfg.metric == "seqlen" and block_size is not None:
        max_difficulty = block_size
    for key, value in (("min_difficulty", cfg.min_difficulty), ("max_difficulty", max_difficulty)):
        if value is None:
            raise ValueError(f"{prefix}.{key} is missing: required when curriculum learning is enabled")
    sched_cfg = CurriculumConfig(
        min_difficulty=cfg.min_difficulty, max_difficulty=max_difficulty, schedule_type=_plain(cfg.schedule_type),
        total_curriculum_step=cfg.total_curriculum_step, difficulty_step=cfg.difficulty_step,
        root_degree=cfg.root_degree, difficulty=list(cfg.difficulty) if cfg.difficulty is not None else None,
        max_step=list(cfg.max_step) if cfg.max_step is not None else None,
        custom_fn=_custom_fn(cfg.custom_fn, f"{prefix}.custom_fn"))
    try:
        with warnings.catch_warnings():
            if cfg.metric != "seqlen":  # the multiple-of-8 advice is about sequence lengths
                warnings.simplefilter("ignore")
            return CurriculumScheduler(sched_cfg)
    except ValueError as exc:
        raise ValueError(f"{prefix}.{exc}") from exc


def build_random_ltd_scheduler(cfg: RandomLTDConfig, block_size: int,
                               prefix: str = "data_efficiency.random_ltd") -> RandomLTDScheduler:
    from .random_ltd import RandomLTDScheduler

    max_value = cfg.max_value if cfg.max_value is not None else block_size
    if max_value > block_size:
        raise ValueError(f"{prefix}.max_value={max_value} exceeds data.block_size={block_size}")
    return RandomLTDScheduler(cfg.min_value, max_value, cfg.require_steps, cfg.seq_per_step, prefix=prefix)


def validate_data_efficiency_config(cfg: DataEfficiencyConfig, n_layer: int, block_size: int,
                                    lr_scheduler_target: str | None = None, prefix: str = "data_efficiency") -> None:
    """Every check the group needs, before any work starts; ValueError naming the key, value and choices.

    lr_scheduler_target: the recipe's ``lr_scheduler._target_`` (the layer-token LR schedule needs one of
    dsrecipes' closed-form schedules, which can be evaluated at any step).
    """
    from .analyzer import BUILTIN_METRICS
    from .random_ltd import validate_layer_ids

    cl = cfg.curriculum_learning
    if cl.enabled:
        p = f"{prefix}.curriculum_learning"
        if cl.schedule_type not in SCHEDULE_TYPES:
            raise ValueError(f"{p}.schedule_type={cl.schedule_type!r} is not valid; choose one of: "
                             f"{', '.join(SCHEDULE_TYPES)}")
        if cl.metric not in BUILTIN_METRICS and ":" not in cl.metric:
            raise ValueError(f"{p}.metric={cl.metric!r} is not valid; choose one of: {', '.join(BUILTIN_METRICS)}, "
                             "or an import path 'pkg.mod:fn' of fn(tokens) -> float")
        if cl.metric == "seqlen":
            if cl.seqlen_mode not in SEQLEN_MODES:
                raise ValueError(f"{p}.seqlen_mode={cl.seqlen_mode!r} is not valid; choose one of: {', '.join(SEQLEN_MODES)}")
        elif ":" in cl.metric:
            _custom_fn(cl.metric, f"{p}.metric")
        if cl.difficulty_type not in DIFFICULTY_TYPES:
            raise ValueError(f"{p}.difficulty_type={cl.difficulty_type!r} is not valid; choose one of: "
                             f"{', '.join(DIFFICULTY_TYPES)}")
        sched = build_curriculum_scheduler(cl, block_size, p)
        if cl.metric == "seqlen":
            if sched.cfg.min_difficulty < 1:
                raise ValueError(f"{p}.min_difficulty={sched.cfg.min_difficulty}: a sequence length must be >= 1")
            if sched.cfg.max_difficulty > block_size:
                raise ValueError(f"{p}.max_difficulty={sched.cfg.max_difficulty} exceeds data.block_size={block_size}")
        elif cl.difficulty_type == "percentile" and not (0 <= sched.cfg.min_difficulty and sched.cfg.max_difficulty <= 100):
            raise ValueError(f"{p}: difficulty_type=percentile needs 0 <= min_difficulty ({sched.cfg.min_difficulty}) "
                             f"and max_difficulty ({sched.cfg.max_difficulty}) <= 100")
    ltd = cfg.random_ltd
    if ltd.enabled:
        p = f"{prefix}.random_ltd"
        validate_layer_ids(ltd.random_ltd_layer_id, n_layer, f"{p}.random_ltd_layer_id")
        build_random_ltd_scheduler(ltd, block_size, p)
        if ltd.layer_token_lr_schedule and lr_scheduler_target:
            raise ValueError(f"{p}.layer_token_lr_schedule=true needs one of dsrecipes' closed-form schedules "
                             f"(lr_scheduler.name), not lr_scheduler._target_={lr_scheduler_target!r}")
