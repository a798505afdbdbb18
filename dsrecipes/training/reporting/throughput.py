"""Throughput that means one thing: tokens the training steps processed, over the time of training steps only.

    meter = ThroughputMeter(dense_tokens_per_step)   # when the run starts (its start-up is timed from here)
    meter.start_training()                            # the loop begins
    meter.add_step(processed_tokens)                  # after every optimizer step
    with meter.paused("eval"):                        # evaluation, checkpoints, export: not training time
        ...
    meter.window()                                    # perf/* of the steps since the last call (a log line)
    meter.totals()                                    # the run's perf/* (summary.json, the progress bar)

Processed tokens are what the model was fed after the recipe's batch hooks: a sequence-length
curriculum's truncated batches count their real length, random-LTD counts the average tokens per
layer (the layer-tokens it kept divided by the number of layers). The full-length count the batch
arithmetic implies (train_batch_size x block_size per step) is reported beside it as
perf/dense_tokens_per_s and train/dense_tokens whenever the two differ. Start-up (data, model,
engine, resume), evaluation and checkpointing (export included) are reported on their own as
perf/startup_s, perf/eval_s and perf/checkpoint_s; time/total_s is the whole run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

PAUSES = ("eval", "checkpoint")


class ThroughputMeter:
    def __init__(self, dense_tokens_per_step: float, synchronize: Callable[[], None] = lambda: None):
        """synchronize: waits for queued device work (CUDA), so that it is timed where it was issued."""
        self.created = time.perf_counter()
        self.dense_tokens_per_step = dense_tokens_per_step
        self.synchronize = synchronize
        self.startup_s = 0.0
        self.train_s = 0.0
        self.paused_s = dict.fromkeys(PAUSES, 0.0)
        self.steps = 0
        self.tokens = 0.0
        self.dense_tokens = 0.0
        self._segment_start: float | None = None
        self._window = _new_window()

    # ------------------------------------------------------------------ the clock
    def start_training(self) -> None:
        now = time.perf_counter()
        self.startup_s = now - self.created
        self._segment_start = now

    def _close_segment(self) -> None:
        """Add the training time since the segment started to the run's and the window's."""
        if self._segment_start is None:
            return
        now = time.perf_counter()
        elapsed = now - self._segment_start
        self.train_s += elapsed
        self._window["s"] += elapsed
        self._segment_start = now

    @contextlib.contextmanager
    def paused(self, kind: str):
        """Time inside is `kind` (eval | checkpoint), not training."""
        training = self._segment_start is not None
        if training:
            self.synchronize()
            self._close_segment()
            self._segment_start = None
        started = time.perf_counter()
        try:
            yield
        finally:
            self.paused_s[kind] += time.perf_counter() - started
            if training:
                self._segment_start = time.perf_counter()

    # ------------------------------------------------------------------ counts
    def add_step(self, processed_tokens: float) -> None:
        self.steps += 1
        self.tokens += processed_tokens
        self.dense_tokens += self.dense_tokens_per_step
        window = self._window
        window["steps"] += 1
        window["tokens"] += processed_tokens
        window["dense"] += self.dense_tokens_per_step

    @property
    def differs_from_dense(self) -> bool:
        return abs(self.tokens - self.dense_tokens) > 0.5

    # ------------------------------------------------------------------ reports
    def window(self) -> dict:
        """perf/tokens_per_s and perf/step_time_s of the steps since the previous call (then a new window)."""
        self.synchronize()
        self._close_segment()
        window, self._window = self._window, _new_window()
        seconds = max(window["s"], 1e-9)
        out = {"perf/tokens_per_s": window["tokens"] / seconds, "perf/step_time_s": window["s"] / max(window["steps"], 1)}
        if self.differs_from_dense:
            out["perf/dense_tokens_per_s"] = window["dense"] / seconds
        return out

    def _trained_s(self) -> float:
        """Training time so far, the open segment included (read without closing it)."""
        open_segment = time.perf_counter() - self._segment_start if self._segment_start is not None else 0.0
        return self.train_s + open_segment

    @property
    def tokens_per_s(self) -> float:
        """Processed tokens per second of training so far (what the progress bar shows)."""
        return self.tokens / max(self._trained_s(), 1e-9)

    def eta_s(self, steps_left: int) -> float:
        """Seconds of training the remaining steps take at this run's pace so far (evaluation not included)."""
        return steps_left * self._trained_s() / max(self.steps, 1)

    def totals(self) -> dict:
        """The run's throughput and where its time went."""
        self._close_segment()
        seconds = max(self.train_s, 1e-9)
        out = {
            "perf/tokens_per_s": self.tokens / seconds,
            "perf/train_s": self.train_s,
            "perf/eval_s": self.paused_s["eval"],
            "perf/checkpoint_s": self.paused_s["checkpoint"],
            "perf/startup_s": self.startup_s,
            "time/total_s": time.perf_counter() - self.created,
            "train/tokens": round(self.tokens),
        }
        if self.differs_from_dense:
            out["perf/dense_tokens_per_s"] = self.dense_tokens / seconds
            out["train/dense_tokens"] = round(self.dense_tokens)
        return out


def _new_window() -> dict:
    """The counts of one log interval: training seconds, steps, processed and dense-equivalent tokens."""
    return {"s": 0.0, "steps": 0, "tokens": 0.0, "dense": 0.0}
