"""The layout-equivalence tests' recipe and assertions: train it through the CLI, read losses and export.

Every run goes through the real CLI (`python -m dsrecipes launcher.nproc_per_node=N ...`), gradient
accumulation 2, clipping at 1.0, fp32, no dropout. Tolerance (see tests/test_distributed.py): losses
within 2e-5 absolute and exported parameters within 5e-5 over STEPS steps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from dsrecipes.models import load_exported
from tests.helpers.cli import run_cli

STEPS = 10


def common(cache: str) -> list[str]:
    return [
        "model=gpt_debug", "model.max_seq_len=64", "data.max_bytes=300000", f"data.cache_dir={cache}",
        f"trainer.max_steps={STEPS}", "trainer.log_interval=1", "trainer.eval_interval=0", "trainer.eval_batches=2",
        "trainer.sample_tokens=0", "trainer.progress_bar=false", "trainer.gradient_accumulation_steps=2",
        "trainer.gradient_clipping=1.0", "lr_scheduler.warmup_num_steps=3", "logger=jsonl", "model.dropout=0.0",
    ]


def run_and_read(tmp_path: Path, name: str, overrides: list[str]) -> tuple[list[float], dict]:
    cwd = tmp_path / name
    cwd.mkdir()
    result = run_cli(overrides, cwd=cwd, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    (run_dir,) = [p for p in (cwd / "outputs").glob("*/*") if p.is_dir()]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    model, _ = load_exported(run_dir / "export")
    return losses, model.state_dict()


def run_layout(folder: Path) -> str:
    """The layout line (dsrecipes.training.layout) of the one run under folder/outputs, from its summary.json."""
    (summary,) = list(folder.glob("outputs/*/*/summary.json"))
    return json.loads(summary.read_text())["layout"]


def run_metric(folder: Path, key: str) -> list[float]:
    """Every logged value of `key` (e.g. "val/loss") of the one run under folder/outputs, from its metrics.jsonl."""
    (metrics,) = list(folder.glob("outputs/*/*/metrics.jsonl"))
    return [r[key] for r in map(json.loads, metrics.read_text().splitlines()) if key in r]


def assert_matches_single_process(losses, params, ref_losses, ref_params) -> None:
    """The run trained, its STEPS losses are within 2e-5 and its exported parameters within 5e-5 of the reference."""
    assert len(losses) == len(ref_losses) == STEPS
    assert ref_losses[-1] < ref_losses[0] - 0.3  # it trained
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=2e-5)
    assert params.keys() == ref_params.keys()
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=0, atol=5e-5, msg=name)


def assert_resumes_in_one_process(tmp_path, datasets_cache, layout: list[str], reference) -> None:
    """A run under `layout` saves at step 5; one process resuming it ends with the reference run's
    losses for steps 6-10 (2e-5) and its exported parameters (5e-5)."""
    base = common(datasets_cache) + ["checkpoint.interval=5", "trainer.train_micro_batch_size_per_gpu=8"]
    run_and_read(tmp_path, "layout", base + layout)
    (checkpoint,) = list((tmp_path / "layout").glob("outputs/*/*/checkpoints/step_5"))
    resumed, params = run_and_read(tmp_path, "one", base + ["launcher.nproc_per_node=1", f"trainer.resume={checkpoint}"])
    assert_resumed_matches(resumed, params, reference)


def assert_resumed_matches(resumed, params, reference) -> None:
    """A run resumed from step 5 ends with the reference run's losses for steps 6-10 (2e-5) and its exported
    parameters (5e-5)."""
    ref_losses, ref_params = reference
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(ref_losses[5:]), rtol=0, atol=2e-5)
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=0, atol=5e-5, msg=name)


def assert_refused(cases: dict) -> None:
    """Each recipe (overrides -> expected message) fails validation, at its launcher.nproc_per_node world size,
    with a ValueError containing the message (validate_recipe is what the CLI runs before spawning)."""
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose

    for args, message in cases.items():
        world = int(next((a.split("=")[1] for a in args if a.startswith("launcher.nproc_per_node=")), 1))
        with pytest.raises(ValueError, match=re.escape(message)):
            validate_recipe(compose(list(args)), dp_world_size=world)
