"""The `profiler` group: torch.profiler traces of the scheduled steps in <run dir>/profiler/."""

import gzip
import json

import pytest
import torch

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.training.trainer import Trainer


def _run(tmp_path, fast_overrides, extra):
    overrides = fast_overrides + [
        "trainer.max_steps=4", "trainer.log_interval=2", "trainer.eval_interval=0", "trainer.sample_tokens=0",
        "checkpoint.save_final=false", "checkpoint.export_safetensors=false", "logger=jsonl", "profiler=trace",
    ] + extra
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    trainer = Trainer(root, tmp_path / "run", batch)
    trainer.fit()
    return trainer


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


@pytest.mark.gpu
def test_memory_snapshot_on_cuda(tmp_path, fast_overrides):
    _run(tmp_path, fast_overrides, ["profiler=memory", "trainer.device=cuda"])
    snapshot = tmp_path / "run/profiler/memory_snapshot_rank0.pickle"
    assert snapshot.stat().st_size > 0
