"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_moe.py;
that module's docstring describes both halves.
"""

import json
import math

import pytest


# ---------------------------------------------------------------- through the Trainer
@pytest.mark.slow
def test_moe_recipe_loss_falls_and_routing_metrics_are_logged(tmp_path, fast_overrides):
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose
    from dsrecipes.training.trainer import Trainer

    cfg = compose(fast_overrides + [
        "moe=top2", "moe.num_experts=4", "trainer.max_steps=30", "trainer.log_interval=10", "logger=jsonl",
        "trainer.sample_tokens=8"])
    root, batch = validate_recipe(cfg, dp_world_size=1)
    summary = Trainer(root, tmp_path, batch).fit()
    assert summary["metrics"]["train/loss"] < summary["metrics"]["train/first_loss"] - 0.5
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/moe_aux_loss" in r]
    assert len(train) == 3 and all(0 < r["train/moe_aux_loss"] < 0.1 for r in train)
    assert all(math.isclose(r["train/loss"], r["train/lm_loss"] + r["train/moe_aux_loss"], rel_tol=1e-5) for r in train)
    routing = [r for r in records if "moe/dropped_frac" in r]
    assert len(routing) == 3 and all(0 <= r["moe/dropped_frac"] < 1 and r["moe/max_load_ratio"] >= 1 for r in routing)
    loads = [r["moe/expert_load/block1"] for r in records if "moe/expert_load/block1" in r]
    assert len(loads) == 3 and all(len(load) == 4 for load in loads)
    # 10 steps x 8 sequences x 64 tokens x 2 routes each
    assert sum(loads[0]) == 10 * batch.train_batch_size * root.data.block_size * 2
