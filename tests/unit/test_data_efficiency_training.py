"""The data_efficiency group in the recipe Trainer: curricula converge, accounting, layer-token LR, exact resume."""

from __future__ import annotations

import json
import math

import pytest

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.training.extensions.recipe import build_extensions
from dsrecipes.training.optim.lr_schedules import build_lr_scheduler
from dsrecipes.training.trainer import Trainer


def trainer_for(run_dir, overrides, extra_callbacks=()):
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    extensions = build_extensions(root)
    extensions.callbacks += list(extra_callbacks)
    return Trainer(root, run_dir, batch, overrides=overrides, extensions=extensions)


def records(run_dir) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.setdefault(rec["step"], {}).update(rec)
    return out


@pytest.fixture
def de_overrides(fast_overrides):
    return fast_overrides + ["trainer.sample_tokens=0", "logger=jsonl", "trainer.log_interval=1"]


def test_seqlen_curriculum_run_converges_and_counts_tokens(tmp_path, de_overrides):
    overrides = de_overrides + [
        "data_efficiency=seqlen_curriculum", "data_efficiency.curriculum_learning.min_difficulty=8",
        "data_efficiency.curriculum_learning.total_curriculum_step=20", "trainer.max_steps=30"]
    summary = trainer_for(tmp_path / "run", overrides).fit()
    m = summary["metrics"]
    assert m["train/loss"] < m["train/first_loss"] - 1.0, m
    assert m["val/loss"] < 4.5
    recs = records(tmp_path / "run")
    # step s (1-based in the log) trained at L(s-1) = floor((s-1)/20 * 56 + 8) rounded down to a multiple of 8
    lengths = [min(64, max(8, math.floor((s - 1) / 20 * 56 + 8) // 8 * 8)) for s in range(1, 31)]
    assert [recs[s]["data/difficulty"] for s in range(1, 31)] == lengths
    assert [recs[s]["data/consumed_tokens"] for s in (1, 10, 30)] == [8 * sum(lengths[:n]) for n in (1, 10, 30)]
    assert recs[30]["data/tokens_saved"] == 8 * 64 * 30 - 8 * sum(lengths)
    assert m["data/tokens_saved"] == recs[30]["data/tokens_saved"] > 0


def test_random_ltd_run_layer_tokens_and_layer_token_lr(tmp_path, de_overrides):
    overrides = de_overrides + [
        "data_efficiency=random_ltd", "data_efficiency.random_ltd.min_value=16",
        "data_efficiency.random_ltd.require_steps=16", "data_efficiency.random_ltd.layer_token_lr_schedule=true",
        "trainer.max_steps=24", "lr_scheduler.warmup_num_steps=10", "lr_scheduler.warmup_type=linear"]
    trainer = trainer_for(tmp_path / "run", overrides)
    summary = trainer.fit()
    assert summary["metrics"]["train/loss"] < summary["metrics"]["train/first_loss"] - 1.0
    recs = records(tmp_path / "run")
    # gpt_debug: 4 layers, layers 1 and 2 drop; kept L(s) = min(64, floor(s/16*48+16) // 16 * 16)
    kept = [min(64, math.floor(s / 16 * 48 + 16) // 16 * 16) for s in range(24)]
    per_step = [8 * (k * 2 + 64 * 2) for k in kept]
    consumed = [sum(per_step[:n]) for n in range(1, 25)]
    assert [recs[s]["data/consumed_layer_tokens"] for s in range(1, 25)] == consumed
    assert [recs[s]["random_ltd/kept_tokens"] for s in range(1, 25)] == kept
    assert recs[24]["data/layer_tokens_saved"] == 8 * 64 * 4 * 24 - consumed[-1]
    # layer-token LR: the LR of step s is the schedule's LR at the step a full-length run would be at after
    # consuming as many layer-tokens (floor(consumed / (8*64*4))), not at step s - 1.
    root, _ = validate_recipe(compose(overrides), dp_world_size=1)
    reference = build_lr_scheduler(root.lr_scheduler, trainer.engine.optimizer, root.trainer.max_steps)
    full = 8 * 64 * 4
    for s in range(2, 25):
        expected = reference.lrs_at(consumed[s - 2] // full)[0]
        assert recs[s]["train/lr"] == pytest.approx(expected, rel=1e-12), s
    assert recs[12]["train/lr"] < reference.lrs_at(11)[0]  # the warmup is slower than by steps


def test_recipe_errors_fire_before_work(fast_overrides):
    with pytest.raises(ValueError, match=r"data_efficiency\.random_ltd\.random_ltd_layer_id=\[1, 7\].*outside"):
        validate_recipe(compose(fast_overrides + ["data_efficiency=random_ltd",
                                                  "data_efficiency.random_ltd.random_ltd_layer_id=[1,7]"]), dp_world_size=1)
    with pytest.raises(ValueError, match=r"curriculum_learning\.min_difficulty=128 must be <= max_difficulty=64"):
        validate_recipe(compose(fast_overrides + ["data_efficiency=seqlen_curriculum",
                                                  "data_efficiency.curriculum_learning.min_difficulty=128"]), dp_world_size=1)
    with pytest.raises(ValueError, match=r"curriculum_learning\.total_curriculum_step=None: required"):
        validate_recipe(compose(fast_overrides + ["data_efficiency=seqlen_curriculum",
                                                  "data_efficiency.curriculum_learning.total_curriculum_step=null"]),
                        dp_world_size=1)


def test_every_data_efficiency_option_and_experiment_composes():
    for option in ("none", "seqlen_curriculum", "metric_curriculum", "random_ltd", "combined"):
        root, _ = validate_recipe(compose([f"data_efficiency={option}"]), dp_world_size=1)
        de = root.data_efficiency
        assert (de.curriculum_learning.enabled, de.random_ltd.enabled) == {
            "none": (False, False), "seqlen_curriculum": (True, False), "metric_curriculum": (True, False),
            "random_ltd": (False, True), "combined": (True, True)}[option]
    for experiment in ("gpt_curriculum", "gpt_curriculum_metric", "gpt_random_ltd"):
        root, _ = validate_recipe(compose([f"+experiment={experiment}"]), dp_world_size=1)
        assert root.name == experiment
