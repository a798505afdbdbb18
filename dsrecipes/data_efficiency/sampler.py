"""Metric-based curriculum sampling: each global batch is drawn only from samples within the current difficulty.

DeepSpeed's data sampler (``data_sampling.curriculum_learning``) reads the data analyzer's index files and,
at every step, samples from the examples whose difficulty is within the curriculum's current bound. Here:

* ``difficulty_type="value"``: eligible = samples with ``metric <= difficulty``;
* ``difficulty_type="percentile"``: eligible = the easiest ``ceil(n * difficulty / 100)`` samples (ties
  broken by sample id).

Global batch ``g`` (at step ``g // gradient_accumulation_steps``) is drawn from
``numpy.random.default_rng([seed, g])``: ``micro_batch_size * world_size`` distinct eligible samples (with
replacement only if fewer are eligible). Rank ``r`` takes the contiguous part ``[r*B, (r+1)*B)``, so ranks
together see what one process with micro-batch ``B*W`` would. The draw is a pure function of
``(seed, g, difficulty)``: the whole state is ``g`` and the curriculum's difficulty, and a resumed sampler
yields exactly the batches an uninterrupted one would. A deliberate simplification of DeepSpeed (which
walks per-difficulty clusters epoch by epoch): batches are drawn independently, so a sample can recur in
consecutive batches before every eligible sample has been seen.

Yields the same ``{"input_ids", "labels"}`` [B, T] micro-batches as ``dsrecipes.data.BatchIterator``
(``block[:-1]`` / ``block[1:]`` of each packed block) and has the same ``state_dict`` / ``load_state_dict``,
so the Trainer checkpoints it as its data position.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .curriculum import DIFFICULTY_TYPES, CurriculumScheduler

__all__ = ["DIFFICULTY_TYPES", "CurriculumSampler"]

_STATE_KEYS = ("global_batch", "seed", "micro_batch_size", "world_size", "num_samples")


class CurriculumSampler:
    """Infinite, deterministic, resumable micro-batches for one rank, drawn within the current difficulty."""

    def __init__(self, dataset, metric_values, scheduler: CurriculumScheduler, micro_batch_size: int, *, seed: int,
                 rank: int = 0, world_size: int = 1, gradient_accumulation_steps: int = 1,
                 difficulty_type: str = "value", column: str = "tokens"):
        if difficulty_type not in DIFFICULTY_TYPES:
            raise ValueError(f"difficulty_type={difficulty_type!r} is not valid; choose one of: {', '.join(DIFFICULTY_TYPES)}")
        values = np.asarray(metric_values)
        if values.ndim != 1 or len(values) != len(dataset):
            raise ValueError(f"metric_values has shape {values.shape}, expected one value per sample ({len(dataset)})")
        for key, value in (("micro_batch_size", micro_batch_size), ("world_size", world_size),
                           ("gradient_accumulation_steps", gradient_accumulation_steps)):
            if value < 1:
                raise ValueError(f"{key}={value} must be >= 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
        if difficulty_type == "percentile":
            cfg = scheduler.cfg
            if not (0 <= cfg.min_difficulty and cfg.max_difficulty <= 100):
                raise ValueError(f"difficulty_type='percentile': min_difficulty={cfg.min_difficulty} and "
                                 f"max_difficulty={cfg.max_difficulty} must lie in [0, 100]")
        self.dataset = dataset
        self.scheduler = scheduler
        self.difficulty_type = difficulty_type
        self.micro_batch_size, self.world_size, self.rank = int(micro_batch_size), int(world_size), int(rank)
        self.gradient_accumulation_steps = int(gradient_accumulation_steps)
        self.seed = int(seed)
        self._order = np.argsort(values, kind="stable")
        self._sorted = values[self._order]
        self._rows = dataset.with_format("numpy", columns=[column])
        self._column = column
        self._global_batch = 0
        self.difficulty = scheduler.get_current_difficulty()
        self.eligible = self.eligible_count(self.difficulty)

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.world_size

    @property
    def step(self) -> int:
        """Optimizer step of the next batch."""
        return self._global_batch // self.gradient_accumulation_steps

    def eligible_count(self, difficulty: float) -> int:
        """How many samples (the easiest first) are within ``difficulty``."""
        n = len(self._sorted)
        if self.difficulty_type == "percentile":
            return max(0, min(n, math.ceil(n * float(difficulty) / 100.0)))
        return int(np.searchsorted(self._sorted, difficulty, side="right"))

    def global_indices(self, global_batch: int, difficulty: float) -> np.ndarray:
        """Sample ids of global batch ``global_batch`` at ``difficulty`` (all ranks' parts)."""
        eligible = self.eligible_count(difficulty)
        if eligible < 1:
            raise ValueError(f"curriculum difficulty {difficulty} ({self.difficulty_type}) admits no sample: the "
                             f"easiest has metric {self._sorted[0] if len(self._sorted) else None}; raise min_difficulty")
        rng = np.random.default_rng([self.seed, int(global_batch)])
        size = self.global_batch_size
        picks = rng.choice(eligible, size, replace=False) if eligible >= size else rng.integers(0, eligible, size)
        return self._order[picks]

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        self.difficulty = self.scheduler.update_difficulty(self.step)
        self.eligible = self.eligible_count(self.difficulty)
        ids = self.global_indices(self._global_batch, self.difficulty)
        mine = ids[self.rank * self.micro_batch_size:(self.rank + 1) * self.micro_batch_size]
        tokens = self._rows[[int(i) for i in mine]][self._column]
        if tokens.dtype == object:
            tokens = np.stack(tokens)
        block = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))
        self._global_batch += 1
        return {"input_ids": block[:, :-1].contiguous(), "labels": block[:, 1:].contiguous()}

    def metrics(self) -> dict[str, float]:
        return {"data/difficulty": self.difficulty, "data/eligible_samples": self.eligible,
                "data/eligible_frac": self.eligible / max(1, len(self._sorted))}

    def state_dict(self) -> dict[str, Any]:
        return {"global_batch": self._global_batch, "seed": self.seed, "micro_batch_size": self.micro_batch_size,
                "world_size": self.world_size, "num_samples": len(self._sorted),
                "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume; ValueError naming the key if the state does not fit this sampler."""
        for key in _STATE_KEYS:
            if key not in state:
                raise ValueError(f"curriculum sampler state has no {key!r} entry (keys: {sorted(state)})")
        if int(state["seed"]) != self.seed:
            raise ValueError(f"curriculum sampler state mismatch: seed={state['seed']} in the state, {self.seed} here")
        if int(state["num_samples"]) != len(self._sorted):
            raise ValueError(f"curriculum sampler state mismatch: num_samples={state['num_samples']} in the state, "
                             f"{len(self._sorted)} here (did the data change?)")
        saved = int(state["micro_batch_size"]) * int(state["world_size"])
        if saved != self.global_batch_size:
            raise ValueError(f"curriculum sampler state mismatch: micro_batch_size x world_size = {saved} in the "
                             f"state, {self.global_batch_size} here")
        self._global_batch = int(state["global_batch"])
        if "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        self.difficulty = self.scheduler.get_current_difficulty()
        self.eligible = self.eligible_count(self.difficulty)

    def __repr__(self) -> str:
        return (f"CurriculumSampler(samples={len(self._sorted)}, {self.difficulty_type}, difficulty={self.difficulty}, "
                f"rank={self.rank}/{self.world_size}, global_batch={self._global_batch})")
