"""The wall-clock breakdown: phase timers add up to the step time; nested and validation phases are not counted."""

import time

from dsrecipes.profiling.phases import StepPhases
from dsrecipes.profiling.wall_clock import WallClockBreakdown


def test_phases_are_free_without_observers_and_timed_with_one():
    phases = StepPhases()
    assert phases("forward") is phases("backward")  # the shared null context: nothing to time
    breakdown = WallClockBreakdown()
    phases.add(breakdown)
    for _ in range(2):  # two optimizer steps
        with phases("forward"):
            with phases("data"):  # inside another phase: charged to the outer one only
                time.sleep(0.01)
        with phases("eval_forward"):  # validation: no part of a step
            time.sleep(0.01)
        with phases("optimizer"):
            pass
    metrics = breakdown.window_metrics()
    assert set(metrics) == {"perf/forward_s", "perf/optimizer_s"}
    assert 0.01 <= metrics["perf/forward_s"] < 0.05  # per step, not the sum of both
    assert breakdown.window_metrics() == {}  # a new window
    phases.remove(breakdown)
    assert not phases.observed
