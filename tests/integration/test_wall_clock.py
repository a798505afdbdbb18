"""The wall-clock breakdown: phase timers add up to the step time; nested and validation phases are not counted."""

import json

import pytest

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.training.trainer import Trainer

PHASE_KEYS = ("perf/data_s", "perf/forward_s", "perf/backward_s", "perf/grad_reduce_s", "perf/optimizer_s")


@pytest.mark.slow
def test_breakdown_sums_to_the_step_time(tmp_path, fast_overrides):
    overrides = fast_overrides + [
        "trainer.max_steps=6", "trainer.log_interval=3", "trainer.gradient_accumulation_steps=2",
        "trainer.eval_interval=0", "trainer.sample_tokens=0", "checkpoint.save_final=false",
        "checkpoint.export_safetensors=false", "logger=jsonl", "trainer.wall_clock_breakdown=true",
    ]
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    Trainer(root, tmp_path / "run", batch).fit()
    logged = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    windows = [m for m in logged if "perf/step_time_s" in m]
    assert [m["step"] for m in windows] == [3, 6]
    for m in windows:
        assert all(key in m for key in PHASE_KEYS), m
        parts = sum(m[key] for key in PHASE_KEYS)
        # what no phase holds: the loop's bookkeeping and the previous log line's writing (a few ms per window)
        assert abs(parts - m["perf/step_time_s"]) <= 0.10 * m["perf/step_time_s"], (parts, m)
        assert m["perf/grad_reduce_s"] < 0.1 * m["perf/backward_s"]  # one rank: nothing to reduce
