"""The `profiler` group: torch.profiler traces of the scheduled steps in <run dir>/profiler/."""

import gzip
import json

import pytest
import torch

from tests.unit.test_torch_trace import _run


def _events(path):
    text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return json.loads(text)["traceEvents"]


@pytest.mark.slow
def test_four_step_run_writes_a_trace_with_the_step_phases(tmp_path, fast_overrides):
    trainer = _run(tmp_path, fast_overrides, ["profiler.memory_snapshot=true"])
    traces = sorted((tmp_path / "run/profiler").glob("rank0.*.pt.trace.json*"))
    assert len(traces) == 1, traces  # one cycle: wait 1, warmup 1, active 2
    names = {event.get("name") for event in _events(traces[0])}
    assert {"dsrecipes/forward", "dsrecipes/backward", "dsrecipes/optimizer", "dsrecipes/data"} <= names
    assert "ProfilerStep#2" in names and "ProfilerStep#3" in names and "ProfilerStep#1" not in names
    assert not trainer.engine.phases.observed  # the labels are gone with the profiler
    if not torch.cuda.is_available():  # memory_snapshot on a CPU run: skipped, and the log says so
        assert not list((tmp_path / "run/profiler").glob("*.pickle"))
        assert "profiler.memory_snapshot=true needs CUDA" in (tmp_path / "run/logs/rank0.log").read_text()
