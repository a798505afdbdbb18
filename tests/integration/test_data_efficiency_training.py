"""The data_efficiency group in the recipe Trainer: curricula converge, accounting, layer-token LR, exact resume."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dsrecipes.training.extensions.base import Callback
from tests.unit.test_data_efficiency_training import (
    de_overrides,  # noqa: F401 - fixtures, used by name
    records,
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


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:difficulty_step")
def test_metric_curriculum_with_random_ltd_resumes_exactly(tmp_path, de_overrides):
    overrides = de_overrides + [
        "data_efficiency=metric_curriculum", "data_efficiency.curriculum_learning.total_curriculum_step=8",
        "data_efficiency.random_ltd.enabled=true", "data_efficiency.random_ltd.min_value=16",
        "data_efficiency.random_ltd.require_steps=8", "trainer.max_steps=8", "trainer.gradient_accumulation_steps=2",
        "trainer.eval_interval=4", "checkpoint.interval=4"]
    straight_trainer = trainer_for(tmp_path / "straight", overrides)
    straight = straight_trainer.fit()
    with pytest.raises(Preempted):
        trainer_for(tmp_path / "first", overrides, [CrashAt(6)]).fit()
    checkpoint = tmp_path / "first" / "checkpoints" / "step_4"
    resumed = trainer_for(tmp_path / "second", overrides + [f"trainer.resume={checkpoint}"]).fit()
    full, tail = records(tmp_path / "straight"), records(tmp_path / "second")
    assert sorted(tail) == list(range(5, 9))
    keys = ("train/loss", "data/difficulty", "data/eligible_samples", "data/consumed_layer_tokens", "random_ltd/kept_tokens")
    for s in range(5, 9):
        assert {k: tail[s][k] for k in keys} == {k: full[s][k] for k in keys}, s  # bitwise, step for step
    assert resumed["metrics"]["val/loss"] == straight["metrics"]["val/loss"]
    # the curriculum restricted the data: logged step s drew from the easiest d percent of the blocks,
    # d = floor(sqrt((s-1)/8) * 90 + 10) (fixed_root, degree 2, from 10 to 100 over 8 steps)
    n = len(straight_trainer.data.train)
    for s in range(1, 9):
        d = math.floor(math.sqrt((s - 1) / 8) * 90 + 10)
        assert full[s]["data/difficulty"] == d and full[s]["data/eligible_samples"] == math.ceil(n * d / 100), s
    # the analyzer's index files were written next to the packed dataset (or in the run dir if it is in memory)
    files = straight_trainer.data.train.cache_files
    folder = (Path(files[0]["filename"]).parent if files else tmp_path / "straight") / "data_analysis"
    assert (folder / "vocab_rarity_index_to_metric.npy").is_file() and (folder / "vocab_rarity.json").is_file()
