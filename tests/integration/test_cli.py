"""`python -m dsrecipes` end to end, in a subprocess as a user runs it: run directory, logs, sweeps, errors."""

import importlib.util
import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.cli import run_cli


def only_run_dir(root: Path) -> Path:
    runs = [p for p in (root / "outputs").glob("*/*") if p.is_dir() and p.parent.name != "multirun"]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.mark.slow
def test_default_run_writes_the_run_directory(tmp_path, fast_overrides):
    with_wandb = importlib.util.find_spec("wandb") is not None  # a dependency; absent on some GPU images
    result = run_cli(fast_overrides + (["logger=all"] if with_wandb else []), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "dsrecipes run summary" in out and "sample from the trained model" in out and "val/ppl" in out

    run_dir = only_run_dir(tmp_path)
    assert run_dir.name.endswith("_gpt")
    for expected in (".hydra/config.yaml", ".hydra/overrides.yaml", "logs/rank0.log", "metrics.jsonl", "summary.json",
                     "checkpoints/latest", "checkpoints/step_20/engine.pt", "checkpoints/step_20/dcp/.metadata",
                     "checkpoints/step_20/config.yaml", "export/model.safetensors"):
        assert (run_dir / expected).exists(), expected
    assert "eval step 20" in (run_dir / "logs" / "rank0.log").read_text()
    # nothing written outside the run directory (besides the datasets cache given in the overrides)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r["train/loss"] for r in records if "train/loss" in r}
    assert sorted(train) == [5, 10, 15, 20]
    assert train[20] < train[5]

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    assert {"train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "val/loss", "val/ppl"} <= \
        set(events.Tags()["scalars"])
    tb_loss = {e.step: e.value for e in events.Scalars("train/loss")}
    assert tb_loss == pytest.approx(train, rel=1e-6)

    if with_wandb:
        offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
        assert offline_runs, "W&B should write an offline run inside the run directory"


@pytest.mark.slow
def test_multirun_sweep_runs_each_job_and_summarises(tmp_path, fast_overrides):
    args = ["-m", "optimizer.lr=1e-3,3e-3"] + [o for o in fast_overrides if not o.startswith("trainer.max_steps")]
    result = run_cli(args + ["trainer.max_steps=6", "trainer.eval_interval=0", "logger=none"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweeps = list((tmp_path / "outputs" / "multirun").glob("*/*"))
    assert len(sweeps) == 1
    jobs = sorted(p for p in sweeps[0].iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"]
    lrs = [json.loads((job / "summary.json").read_text())["overrides"] for job in jobs]
    assert "optimizer.lr=0.001" in lrs[0] and "optimizer.lr=0.003" in lrs[1]
    assert "multirun summary" in result.stdout and "optimizer.lr=0.003" in result.stdout


@pytest.mark.slow
def test_bad_input_fails_before_work_with_clear_messages(tmp_path, fast_overrides):
    missing = tmp_path / "no_such_corpus.txt"
    result = run_cli(fast_overrides + ["data=files", f"data.paths=[{missing}]"], cwd=tmp_path)
    assert result.returncode != 0
    assert str(missing) in result.stderr and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr

    tiny = tmp_path / "tiny"
    tiny.mkdir()
    for i in range(3):
        (tiny / f"doc{i}.txt").write_text("tiny document\n")
    result = run_cli(fast_overrides + ["data=files", f"data.paths=[{tiny}]"], cwd=tmp_path)
    assert result.returncode != 0
    assert "corpus too small" in result.stderr

    result = run_cli(["model=gpt_huge"], cwd=tmp_path)
    assert result.returncode != 0
    assert "gpt_huge" in result.stderr and "gpt_tiny" in result.stderr
