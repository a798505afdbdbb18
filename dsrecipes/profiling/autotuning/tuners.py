"""In which order the autotuner tries candidates, and when it stops (DeepSpeed's tuner_type, tuner_num_trials,
tuner_early_stopping).

    tuner, note = make_tuner("model_based", candidates, higher_is_better=True, seed=1234)
    outcome = run_tuning(tuner, measure, num_trials=50, early_stopping=5, higher_is_better=True)

gridsearch: the candidates in grid order (stage, checkpointing, offload, then micro-batch ascending).
random: a permutation seeded by tuner_seed. model_based: Optuna's TPE sampler (when optuna is installed)
proposes a (stage, checkpointing, offload) group and a position among that group's micro-batch sizes; a
proposal already measured is told its known value and another asked for. Without optuna it falls back to
random, and the note says so. `measure(candidate)` returns the metric value, or None for a failed trial
(out of memory, a crash): failures are recorded and count as trials without improvement.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from dsrecipes.profiling.autotuning.space import Candidate, Group


class Tuner:
    """Proposes candidates one at a time; learns from each result (value None = failed)."""

    name = "tuner"

    def __init__(self, candidates: list[Candidate], higher_is_better: bool = True, seed: int = 0):
        self.candidates = list(candidates)
        self.higher_is_better = higher_is_better
        self.seed = seed
        self.tried: dict[Candidate, float | None] = {}

    def next(self) -> Candidate | None:
        raise NotImplementedError

    def record(self, candidate: Candidate, value: float | None) -> None:
        self.tried[candidate] = value


class GridSearchTuner(Tuner):
    name = "gridsearch"

    def next(self) -> Candidate | None:
        return next((c for c in self.candidates if c not in self.tried), None)


class RandomTuner(Tuner):
    name = "random"

    def __init__(self, candidates: list[Candidate], higher_is_better: bool = True, seed: int = 0):
        super().__init__(candidates, higher_is_better, seed)
        self.order = list(self.candidates)
        random.Random(seed).shuffle(self.order)

    def next(self) -> Candidate | None:
        return next((c for c in self.order if c not in self.tried), None)


class OptunaTuner(Tuner):
    """TPE over (group, position of the micro-batch among the group's sizes), through Optuna's ask-and-tell API."""

    name = "model_based (optuna TPE)"

    def __init__(self, candidates: list[Candidate], higher_is_better: bool = True, seed: int = 0):
        try:
            import optuna
        except ImportError as missing:  # make_tuner checks first; falls back to random without optuna
            raise RuntimeError("OptunaTuner needs optuna (pip install optuna)") from missing

        super().__init__(candidates, higher_is_better, seed)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self.study = optuna.create_study(direction="maximize" if higher_is_better else "minimize",
                                         sampler=optuna.samplers.TPESampler(seed=seed))
        self.groups: dict[str, list[Candidate]] = {}
        for c in self.candidates:
            self.groups.setdefault(_group_key(c.group), []).append(c)
        self._pending: dict[Candidate, object] = {}
        self._fallback = RandomTuner(self.candidates, higher_is_better, seed)

    def _propose(self) -> tuple[object, Candidate]:
        trial = self.study.ask()
        members = self.groups[trial.suggest_categorical("group", sorted(self.groups))]
        position = trial.suggest_float("micro_batch_position", 0.0, 1.0)
        return trial, members[round(position * (len(members) - 1))]

    def next(self) -> Candidate | None:
        if len(self.tried) >= len(self.candidates):
            return None
        for _ in range(20 * len(self.candidates)):
            trial, candidate = self._propose()
            if candidate not in self.tried:
                self._pending[candidate] = trial
                return candidate
            known = self.tried[candidate]  # already measured: tell the sampler what it was, ask again
            if known is None:
                self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
            else:
                self.study.tell(trial, known)
        self._fallback.tried = self.tried  # TPE keeps proposing measured points: take an untried one
        return self._fallback.next()

    def record(self, candidate: Candidate, value: float | None) -> None:
        super().record(candidate, value)
        trial = self._pending.pop(candidate, None)
        if trial is None:
            return
        if value is None:
            self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, value)


def _group_key(group: Group) -> str:
    return f"z{group.zero_stage} ac={group.activation_checkpointing or 'recipe'} offload={group.offload}"


def optuna_available() -> bool:
    return importlib.util.find_spec("optuna") is not None


def make_tuner(kind: str, candidates: list[Candidate], higher_is_better: bool, seed: int) -> tuple[Tuner, str | None]:
    """The tuner for hydra.sweeper.tuner_type, and a note to show (model_based without optuna falls back)."""
    kind = str(kind)
    if kind == "gridsearch":
        return GridSearchTuner(candidates, higher_is_better, seed), None
    if kind == "random":
        return RandomTuner(candidates, higher_is_better, seed), None
    if kind == "model_based":
        if optuna_available():
            return OptunaTuner(candidates, higher_is_better, seed), None
        return RandomTuner(candidates, higher_is_better, seed), (
            "tuner_type=model_based needs optuna (pip install optuna), which is not installed: "
            "trying the candidates in random order instead (tuner_type=random)")
    raise ValueError(f"hydra.sweeper.tuner_type={kind!r} is not valid; choose one of: gridsearch, random, model_based")


@dataclass
class TuningOutcome:
    """What ran, in order, and why the search ended."""

    trials: list[tuple[Candidate, float | None]] = field(default_factory=list)
    best: tuple[Candidate, float] | None = None
    stopped: str = "every candidate was tried"


def run_tuning(
    tuner: Tuner,
    measure: Callable[[Candidate], float | None],
    num_trials: int,
    early_stopping: int,
    higher_is_better: bool,
) -> TuningOutcome:
    """Trials until the candidates, num_trials or patience run out (early_stopping trials without a better value)."""
    outcome = TuningOutcome()
    since_best = 0
    while True:
        if len(outcome.trials) >= num_trials:
            outcome.stopped = f"tuner_num_trials={num_trials} reached"
            break
        candidate = tuner.next()
        if candidate is None:
            break
        value = measure(candidate)
        tuner.record(candidate, value)
        outcome.trials.append((candidate, value))
        better = value is not None and (outcome.best is None or
                                        (value > outcome.best[1] if higher_is_better else value < outcome.best[1]))
        if better:
            outcome.best, since_best = (candidate, value), 0
        else:
            since_best += 1
        if early_stopping and since_best >= early_stopping:
            outcome.stopped = f"early stopping: {since_best} trials without improvement (tuner_early_stopping={early_stopping})"
            break
    return outcome
