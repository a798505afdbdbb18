"""The wall-clock breakdown (DeepSpeed's `wall_clock_breakdown`): seconds per step in each phase, per log interval.

    python -m dsrecipes model=gpt_debug trainer.wall_clock_breakdown=true

logs, at every log step, to every metric sink (console debug line, metrics.jsonl, TensorBoard, W&B):

    perf/data_s  perf/forward_s  perf/backward_s  perf/grad_reduce_s  perf/optimizer_s
    (perf/forward_backward_s under pipeline parallelism)

each the mean per optimizer step over the log interval, in seconds, beside perf/step_time_s. What
each phase holds (where gradient communication is counted) is dsrecipes.profiling.phases'. On CUDA
every phase boundary synchronises the device (torch.cuda.synchronize), so a phase is charged for its
own kernels rather than the ones queued before it; that costs some overlap, which is why it is off by
default, and with it off no phase is timed and nothing synchronises. What is not in any phase (the
loop's bookkeeping, extra loss terms such as distillation, logging) is the difference to
perf/step_time_s.

On the library path: `engine.phases.add(breakdown := WallClockBreakdown(device))`, then
`breakdown.window_metrics()` whenever you log (steps are counted by their optimizer phase, skipped
steps included).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch

from dsrecipes.profiling.phases import TRAINING_PHASES


class WallClockBreakdown:
    """An observer of dsrecipes.profiling.phases.StepPhases that adds up the seconds spent in each phase."""

    def __init__(self, device: torch.device | None = None):
        self.device = device
        self._sync = device is not None and device.type == "cuda"
        self._seconds: dict[str, float] = defaultdict(float)
        self._steps = 0  # optimizer phases seen: one per optimizer step, a skipped (overflow) one included
        self._depth = 0  # a phase inside another (data drawn inside a pipeline phase) is charged to the outer

    def _synchronize(self) -> None:
        if self._sync:
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self._depth or name not in TRAINING_PHASES:  # validation forwards are not part of a step
            yield
            return
        self._depth += 1
        self._synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._synchronize()
            self._seconds[name] += time.perf_counter() - start
            self._depth -= 1
            self._steps += name == "optimizer"

    def window_metrics(self) -> dict[str, float]:
        """perf/<phase>_s: seconds per optimizer step in each phase since the last call (then reset)."""
        seconds, self._seconds = self._seconds, defaultdict(float)
        steps, self._steps = max(self._steps, 1), 0
        return {f"perf/{name}_s": total / steps for name, total in sorted(seconds.items())}
