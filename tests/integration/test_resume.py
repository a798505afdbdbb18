"""Checkpoints in the recipe: exact resume, auto discovery, atomic saves, mismatch errors, export."""

import json

import pytest

from dsrecipes.training.extensions.base import Callback, Extensions
from tests.unit.test_resume import (
    resume_overrides,  # noqa: F401 - fixtures, used by name
    trainer_for,
)


class Preempted(Exception):
    pass


class CrashAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer, step, metrics):
        if step == self.step:
            raise Preempted(step)


def losses(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run_bitwise(tmp_path, resume_overrides):
    straight = trainer_for(tmp_path / "straight", resume_overrides).fit()
    with pytest.raises(Preempted):
        trainer_for(tmp_path / "first", resume_overrides, Extensions(callbacks=[CrashAt(11)])).fit()
    checkpoint = tmp_path / "first" / "checkpoints" / "step_8"
    assert (tmp_path / "first" / "checkpoints" / "latest").read_text() == "step_8"
    resumed = trainer_for(tmp_path / "second", resume_overrides + [f"trainer.resume={checkpoint}"]).fit()

    full, tail = losses(tmp_path / "straight"), losses(tmp_path / "second")
    assert sorted(tail) == list(range(9, 17))
    assert [tail[s] for s in range(9, 17)] == [full[s] for s in range(9, 17)]  # bitwise, loss for loss
    assert resumed["metrics"]["val/loss"] == straight["metrics"]["val/loss"]


@pytest.mark.slow
def test_resume_auto_finds_the_previous_run_of_the_same_name(tmp_path, resume_overrides):
    outputs = tmp_path / "outputs" / "2026-11-30"
    with pytest.raises(Preempted):
        trainer_for(outputs / "10-00-00_gpt", resume_overrides, Extensions(callbacks=[CrashAt(9)])).fit()
    second = trainer_for(outputs / "10-05-00_gpt", resume_overrides + ["trainer.resume=auto"])
    second.fit()
    assert sorted(losses(outputs / "10-05-00_gpt")) == list(range(9, 17))
    # a fresh name finds nothing and starts from step 0
    fresh = trainer_for(outputs / "10-06-00_other", resume_overrides + ["trainer.resume=auto", "name=other"])
    fresh.fit()
    assert min(losses(outputs / "10-06-00_other")) == 1


@pytest.mark.slow
def test_fp16_recipe_logs_scale_and_skipped_steps(tmp_path, fast_overrides):
    run_dir = tmp_path / "run"
    trainer_for(run_dir, fast_overrides + ["precision=fp16", "precision.initial_scale_power=8", "trainer.max_steps=10"]).fit()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert all("train/loss_scale" in r and "train/skipped_steps" in r for r in train)
    assert train[-1]["train/loss"] < train[0]["train/loss"]
