"""Sequence-length curriculum as a batch hook (DeepSpeed's legacy ``curriculum_type: "seqlen"``).

DeepSpeed's engine calls ``update_difficulty(global_steps + 1)`` before each forward and the model cuts
its inputs to ``[:, :curriculum_seqlen]``. `SeqlenCurriculum` does that cut on the batch instead:

    sched = CurriculumScheduler(CurriculumConfig(min_difficulty=8, max_difficulty=1024,
                                                 schedule_type="fixed_linear",
                                                 total_curriculum_step=10_000, difficulty_step=8))
    hook = SeqlenCurriculum(sched)
    batch = hook(batch, step=engine.global_steps + 1)

Only ``input_ids`` and ``labels`` (the ``keys`` argument) are cut along T; other entries pass
through unchanged, so add e.g. ``attention_mask`` / ``position_ids`` to ``keys`` if the batch has them.

Modes:

* ``truncate`` (DeepSpeed): keep ``[:, :d]`` of every row; the rest of each row is not trained on.
* ``pack``: cut every row of T tokens into ``T // d`` rows of ``d`` tokens (``[B, T] -> [B * T//d, d]``), so
  the step still trains on (almost) every token of the batch, each with at most ``d - 1`` tokens of context.
  Only the remainder ``T % d`` of each row is dropped. Rows of packed blocks are contiguous text, so the
  chunks are valid shorter sequences and ``labels`` stay aligned with ``input_ids``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .curriculum import SEQLEN_MODES, CurriculumScheduler

__all__ = ["SEQLEN_MODES", "SeqlenCurriculum"]


class SeqlenCurriculum:
    """Callable ``hook(batch, step) -> batch`` truncating [B, T] tensors to the scheduler's difficulty.

    Token accounting (cumulative over calls, counted on the first present key, normally ``input_ids``):
    ``tokens_seen`` = tokens in the returned rows, ``tokens_saved`` = B * T minus that.
    """

    def __init__(self, scheduler: CurriculumScheduler, mode: str = "truncate",
                 keys: Sequence[str] = ("input_ids", "labels")):
        if mode not in SEQLEN_MODES:
            raise ValueError(f"mode={mode!r} is not supported; valid choices: {list(SEQLEN_MODES)}")
        if not keys:
            raise ValueError("keys=(): at least one batch key to truncate is required")
        self.scheduler = scheduler
        self.mode = mode
        self.keys = tuple(keys)
        self.tokens_seen = 0
        self.tokens_saved = 0
        self.difficulty: int = scheduler.get_current_difficulty()
        self.last_shape: tuple[int, int] | None = None

    def __call__(self, batch: Mapping[str, Any], step: int) -> dict[str, Any]:
        difficulty = int(self.scheduler.update_difficulty(step))
        if difficulty < 1:
            raise ValueError(f"curriculum difficulty {difficulty} at step {step}: a sequence length must be >= 1")
        self.difficulty = difficulty

        present = [k for k in self.keys if k in batch]
        if not present:
            raise ValueError(f"batch has none of the keys {list(self.keys)} (keys: {sorted(batch)})")
        shape = None
        for key in present:
            value = batch[key]
            if not isinstance(value, torch.Tensor) or value.dim() != 2:
                raise ValueError(f"batch[{key!r}]: expected a [B, T] tensor, got "
                                 f"{tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}")
            if shape is None:
                shape = tuple(value.shape)
            elif tuple(value.shape) != shape:
                raise ValueError(f"batch[{key!r}] has shape {tuple(value.shape)}, "
                                 f"but batch[{present[0]!r}] has {shape}")

        batch_size, full_len = shape
        kept_len = min(difficulty, full_len)
        chunks = full_len // kept_len if self.mode == "pack" else 1
        out = dict(batch)
        if kept_len < full_len:
            for key in present:
                cut = batch[key][:, :chunks * kept_len]
                out[key] = cut.reshape(batch_size * chunks, kept_len) if chunks > 1 else cut.contiguous()
        self.last_shape = (batch_size * chunks, kept_len)
        self.tokens_seen += batch_size * chunks * kept_len
        self.tokens_saved += batch_size * (full_len - chunks * kept_len)
        return out

    def metrics(self) -> dict[str, int]:
        """Current difficulty and cumulative kept / saved token counts."""
        return {"data/difficulty": self.difficulty, "data/kept_tokens": self.tokens_seen,
                "data/tokens_saved": self.tokens_saved}

    def state_dict(self) -> dict[str, Any]:
        """Token counters and the scheduler's state (for checkpoint/resume)."""
        return {"tokens_seen": self.tokens_seen, "tokens_saved": self.tokens_saved,
                "difficulty": self.difficulty, "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.tokens_seen = int(state["tokens_seen"])
        self.tokens_saved = int(state["tokens_saved"])
        if "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        self.difficulty = int(state.get("difficulty", self.scheduler.get_current_difficulty()))
