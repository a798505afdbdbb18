"""Curriculum-learning pacing functions, following DeepSpeed's `CurriculumScheduler`.

A curriculum maps the training step to a *difficulty* (for the sequence-length curriculum, the number of
tokens per sample; see `dsrecipes.data_efficiency.seqlen`). The key names and the pacing formulas are
DeepSpeed's (`deepspeed/runtime/data_pipeline/curriculum_scheduler.py`); the DeepSpeed `schedule_config`
sub-block is flattened into `CurriculumConfig` fields (`CurriculumConfig.from_dict` accepts either form).

Schedules (s = step, T = total_curriculum_step, m = min_difficulty, M = max_difficulty,
k = difficulty_step), exactly as DeepSpeed's ``__fixed_root_get_difficulty`` computes them (0.19.7 and later):

* ``fixed_root``: ``d = floor((s/T) ** (1/root_degree) * (M - m) + m)``, rounded down to a multiple of
  ``k`` (``d - d % k``), raised to at least ``ceil(m / k) * k`` (the first multiple of ``k`` at or above
  ``m``), then capped at ``M``. The cap is applied last, so a ``M`` that is not a multiple of ``k`` is
  still reached (``min(d, M)``), and a ``ceil(m / k) * k`` above ``M`` gives ``M`` at every step.
  Example: ``m=10, k=8`` gives 16 at step 0, not 10; ``m=5, k=8`` gives 8.
* ``fixed_linear``: ``fixed_root`` with ``root_degree=1``.
* ``fixed_discrete``: ``difficulty[-1]`` when ``s > max_step[-1]``, else ``difficulty[i]`` for the first
  ``i`` with ``s <= max_step[i]`` (``len(difficulty) == len(max_step) + 1``). Values are used as given:
  no rounding, no clamping to ``[m, M]``.
* ``custom``: ``custom_fn(step) -> difficulty``; a callable or an import path ``"pkg.mod:fn"``.

The lower bound is DeepSpeed's: rounding down alone could land below ``m`` (``m=8, k=16`` gives 0, a
zero-length sequence), and raising it to ``m`` itself would break the promise that every difficulty is
a multiple of ``k``; the first multiple of ``k`` at or above ``m`` keeps both.

`CurriculumScheduler.update_difficulty(step)` only advances while the current difficulty is below
``max_difficulty`` (DeepSpeed); once the maximum is reached it stays there. Before the first update
the current difficulty is ``min_difficulty`` itself (DeepSpeed's initial state), not the rounded value.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import numbers
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DIFFICULTY_TYPES", "SCHEDULE_TYPES", "SEQLEN_MODES", "CurriculumConfig", "CurriculumScheduler",
           "resolve_custom_fn"]

SCHEDULE_TYPES = ("fixed_linear", "fixed_root", "fixed_discrete", "custom")
# The metric curriculum's difficulty types (sampler.CurriculumSampler) and the seqlen curriculum's modes
# (seqlen.SeqlenCurriculum): defined in this torch-free module, so that the recipe schema (config.py) builds
# its Enums from them without importing torch (`python -m dsrecipes --help` composes the recipe only).
DIFFICULTY_TYPES = ("value", "percentile")
SEQLEN_MODES = ("truncate", "pack")

# Keys of a DeepSpeed curriculum block that describe the data pipeline rather than the schedule;
# `from_dict` accepts and ignores them.
_IGNORED_KEYS = frozenset({"enabled", "curriculum_type", "difficulty_type", "clustering_type",
                           "index_to_sample_path", "index_to_metric_path"})

# Which schedule-config keys each schedule type requires (DeepSpeed asserts their presence).
_REQUIRED = {
    "fixed_linear": ("total_curriculum_step", "difficulty_step"),
    "fixed_root": ("total_curriculum_step", "difficulty_step", "root_degree"),
    "fixed_discrete": ("difficulty", "max_step"),
    "custom": ("custom_fn",),
}


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def resolve_custom_fn(spec: Callable[[int], Any] | str) -> Callable[[int], Any]:
    """Return `spec` if callable, else resolve an import path.

    ``"pkg.mod:attr.path"`` imports ``pkg.mod`` and walks ``attr.path``; the colon-free form ``"pkg.mod.fn"``
    treats only the last component as the attribute.
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"custom_fn={spec!r}: expected a callable or an import path 'pkg.mod:fn'")
    if ":" in spec:
        module_name, _, attr_path = spec.partition(":")
    else:
        module_name, _, attr_path = spec.rpartition(".")
    if not module_name or not attr_path:
        raise ValueError(f"custom_fn={spec!r}: expected an import path of the form 'pkg.mod:fn'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"custom_fn={spec!r}: cannot import module {module_name!r} ({exc})") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ValueError(f"custom_fn={spec!r}: module {module_name!r} has no attribute {attr_path!r}") from exc
    if not callable(obj):
        raise ValueError(f"custom_fn={spec!r}: {attr_path!r} is not callable")
    return obj


@dataclass
class CurriculumConfig:
    """One curriculum (DeepSpeed key names; the ``schedule_config`` entries are flattened).

    Which of the optional fields are required depends on ``schedule_type``:
    ``fixed_linear``: total_curriculum_step, difficulty_step; ``fixed_root``: those and root_degree;
    ``fixed_discrete``: difficulty, max_step; ``custom``: custom_fn.
    """

    min_difficulty: int
    max_difficulty: int
    schedule_type: str = "fixed_linear"
    total_curriculum_step: int | None = None
    difficulty_step: int | None = None
    root_degree: float | None = None
    difficulty: list[int] | None = None
    max_step: list[int] | None = None
    custom_fn: Callable[[int], Any] | str | None = None

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> CurriculumConfig:
        """Build from a flat dict or a DeepSpeed block with a nested ``schedule_config``.

        Keys such as ``enabled`` and ``curriculum_type`` (legacy block) are ignored; any other unknown
        key raises ValueError.
        """
        flat: dict[str, Any] = {}
        for key, value in config.items():
            if key == "schedule_config":
                if not isinstance(value, Mapping):
                    raise ValueError(f"schedule_config={value!r}: expected a mapping")
                flat.update(value)
            elif key not in _IGNORED_KEYS:
                flat[key] = value
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(flat) - names)
        if unknown:
            raise ValueError(f"unknown curriculum key(s) {unknown}; valid keys: {sorted(names)}")
        for required in ("min_difficulty", "max_difficulty"):
            if required not in flat:
                raise ValueError(f"curriculum config is missing required key {required!r}")
        for list_key in ("difficulty", "max_step"):
            if flat.get(list_key) is not None:
                flat[list_key] = list(flat[list_key])
        return cls(**flat)

    def validate(self) -> None:
        """Raise ValueError naming the offending key, its value and what is allowed.

        Warns (UserWarning), as DeepSpeed does, when a fixed_linear/fixed_root ``difficulty_step`` is not a
        multiple of 8 (tensor-core alignment for a sequence-length metric).
        """
        if self.schedule_type not in SCHEDULE_TYPES:
            raise ValueError(f"schedule_type={self.schedule_type!r} is not supported; valid choices: "
                             f"{list(SCHEDULE_TYPES)}")
        for key in ("min_difficulty", "max_difficulty"):
            value = getattr(self, key)
            if not _is_int(value):
                raise ValueError(f"{key}={value!r}: must be an integer")
        if self.min_difficulty > self.max_difficulty:
            raise ValueError(f"min_difficulty={self.min_difficulty} must be <= max_difficulty={self.max_difficulty}")
        for key in _REQUIRED[self.schedule_type]:
            if getattr(self, key) is None:
                raise ValueError(f"{key}=None: required when schedule_type={self.schedule_type!r} "
                                 f"(required keys: {list(_REQUIRED[self.schedule_type])})")

        if self.schedule_type in ("fixed_linear", "fixed_root"):
            if not _is_int(self.total_curriculum_step) or self.total_curriculum_step <= 0:
                raise ValueError(f"total_curriculum_step={self.total_curriculum_step!r}: must be a positive integer")
            if not _is_int(self.difficulty_step) or self.difficulty_step <= 0:
                raise ValueError(f"difficulty_step={self.difficulty_step!r}: must be a positive integer")
            if self.schedule_type == "fixed_root" and (not _is_real(self.root_degree) or self.root_degree <= 0):
                raise ValueError(f"root_degree={self.root_degree!r}: must be a positive number "
                                 "(1 = linear, 2 = square root, ...)")
            if self.difficulty_step % 8 != 0:
                warnings.warn(
                    f"difficulty_step={self.difficulty_step}: when the curriculum metric is sequence length, "
                    "difficulty_step should be a multiple of 8 (FP16) or 16 (INT8) to enable NVIDIA Tensor Core "
                    "acceleration; disregard this warning if it does not apply to your metric/hardware",
                    UserWarning, stacklevel=2)
        elif self.schedule_type == "fixed_discrete":
            difficulty, max_step = self.difficulty, self.max_step
            if not isinstance(difficulty, (list, tuple)) or len(difficulty) == 0:
                raise ValueError(f"difficulty={difficulty!r}: must be a non-empty list")
            if not isinstance(max_step, (list, tuple)) or len(max_step) == 0:
                raise ValueError(f"max_step={max_step!r}: must be a non-empty list")
            if len(difficulty) != len(max_step) + 1:
                raise ValueError(f"difficulty={list(difficulty)!r} / max_step={list(max_step)!r}: len(difficulty) "
                                 f"must be len(max_step) + 1 (the last difficulty holds after the last max_step), "
                                 f"got {len(difficulty)} and {len(max_step)}")
            if not all(_is_int(v) for v in difficulty):
                raise ValueError(f"difficulty={list(difficulty)!r}: entries must be integers")
            if not all(_is_int(v) for v in max_step):
                raise ValueError(f"max_step={list(max_step)!r}: entries must be integers")
            if any(b <= a for a, b in zip(max_step, max_step[1:])):
                raise ValueError(f"max_step={list(max_step)!r}: must be strictly increasing")
        else:  # custom
            resolve_custom_fn(self.custom_fn)


class CurriculumScheduler:
    """Step -> difficulty, with DeepSpeed's `update_difficulty` semantics and checkpointable state.

    The current difficulty starts at ``min_difficulty``. ``update_difficulty(step)`` recomputes it only
    while it is below ``max_difficulty``.
    """

    def __init__(self, cfg: CurriculumConfig | Mapping[str, Any]):
        if not isinstance(cfg, CurriculumConfig):
            cfg = CurriculumConfig.from_dict(cfg)
        self.cfg = cfg
        self.validate()
        self._custom_fn = resolve_custom_fn(cfg.custom_fn) if cfg.schedule_type == "custom" else None
        self.current_difficulty: int = cfg.min_difficulty
        self.step: int | None = None  # the step last passed to update_difficulty

    def validate(self) -> None:
        """Validate the config (see `CurriculumConfig.validate`)."""
        self.cfg.validate()

    def set_custom_get_difficulty(self, fn: Callable[[int], Any] | str) -> None:
        """Replace the ``custom`` schedule's function (DeepSpeed's `set_custom_curriculum_learning_schedule`)."""
        if self.cfg.schedule_type != "custom":
            raise ValueError(f"schedule_type={self.cfg.schedule_type!r}: a custom difficulty function needs "
                             "schedule_type='custom'")
        self._custom_fn = resolve_custom_fn(fn)

    def get_current_difficulty(self) -> int:
        return self.current_difficulty

    def get_difficulty(self, step: int) -> int:
        """The difficulty the schedule assigns to `step` (pure; does not change the current difficulty)."""
        if not _is_real(step) or step < 0:
            raise ValueError(f"step={step!r}: must be a non-negative number")
        cfg = self.cfg
        if cfg.schedule_type == "fixed_linear":
            return self._fixed_root(step, 1)
        if cfg.schedule_type == "fixed_root":
            return self._fixed_root(step, cfg.root_degree)
        if cfg.schedule_type == "fixed_discrete":
            for max_step, difficulty in zip(cfg.max_step, cfg.difficulty):
                if step <= max_step:
                    return difficulty
            return cfg.difficulty[-1]
        value = self._custom_fn(step)
        if not _is_real(value):
            raise ValueError(f"custom_fn({step}) returned {value!r}: expected a number")
        return int(value)

    def _fixed_root(self, step: float, root_degree: float) -> int:
        cfg = self.cfg
        frac = (float(step) / cfg.total_curriculum_step) ** (1.0 / root_degree)
        d = math.floor(frac * (cfg.max_difficulty - cfg.min_difficulty) + cfg.min_difficulty)
        d -= d % cfg.difficulty_step
        return min(max(d, self._lowest_scheduled_difficulty()), cfg.max_difficulty)

    def _lowest_scheduled_difficulty(self) -> int:
        """fixed_linear / fixed_root floor: the first multiple of difficulty_step at or above min_difficulty.

        DeepSpeed's floor (not min_difficulty itself), so every scheduled difficulty below the cap is a
        multiple of difficulty_step.
        """
        k = self.cfg.difficulty_step
        return -(-self.cfg.min_difficulty // k) * k

    def update_difficulty(self, step: int) -> int:
        """Advance to `step` (DeepSpeed's engine passes ``global_steps + 1``) and return the current difficulty."""
        if self.current_difficulty < self.cfg.max_difficulty:
            self.current_difficulty = self.get_difficulty(step)
        self.step = step
        return self.current_difficulty

    def state_dict(self) -> dict[str, Any]:
        return {"current_difficulty": self.current_difficulty, "step": self.step,
                "schedule_type": self.cfg.schedule_type}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "current_difficulty" not in state:
            raise ValueError(f"curriculum state is missing 'current_difficulty' (keys: {sorted(state)})")
        self.current_difficulty = int(state["current_difficulty"])
        self.step = state.get("step")

    def __repr__(self) -> str:
        return f"CurriculumScheduler({self.cfg!r}, current_difficulty={self.current_difficulty})"
