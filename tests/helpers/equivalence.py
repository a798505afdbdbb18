"""The layout-equivalence tests' recipe and assertions: train it through the CLI, read losses and export.

Every run goes through the real CLI (`python -m dsrecipes launcher.nproc_per_node=N ...`), gradient
accumulation 2, clipping at 1.0, fp32, no dropout. Tolerance (see tests/integration/equivalence/table.py): losses
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


def assert_same_training(losses, params, ref_losses, ref_params, loss_atol: float = 2e-5,
                         params_atol: float = 5e-5, trained_by: float = 0.3) -> None:
    """The run trained STEPS steps like the reference: losses within `loss_atol`, exported parameters (the same names)
    within `params_atol`, absolute; the reference itself trained (its loss fell by more than `trained_by`)."""
    assert len(losses) == len(ref_losses) == STEPS
    assert ref_losses[-1] < ref_losses[0] - trained_by  # it trained
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=loss_atol)
    assert params.keys() == ref_params.keys()
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=0, atol=params_atol, msg=name)


def assert_matches_single_process(losses, params, ref_losses, ref_params) -> None:
    """assert_same_training at the fp32 layout tolerances: losses 2e-5, exported parameters 5e-5."""
    assert_same_training(losses, params, ref_losses, ref_params)


def assert_resumed_matches(resumed, params, ref_losses, ref_params, loss_atol: float = 2e-5,
                           params_atol: float = 5e-5) -> None:
    """A run resumed from step 5 ends with the reference run's losses for steps 6-10 and its exported parameters."""
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(ref_losses[5:]), rtol=0, atol=loss_atol)
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=0, atol=params_atol, msg=name)


def assert_refused(cases: dict) -> None:
    """Each recipe (overrides -> expected message) fails validation, at its launcher.nproc_per_node world size,
    with a ValueError containing the message (validate_recipe is what the CLI runs before spawning)."""
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose

    for args, message in cases.items():
        world = int(next((a.split("=")[1] for a in args if a.startswith("launcher.nproc_per_node=")), 1))
        with pytest.raises(ValueError, match=re.escape(message)):
            validate_recipe(compose(list(args)), dp_world_size=world)
