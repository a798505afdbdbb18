"""Activation checkpointing: same losses, fewer saved activation bytes, state-dict keys unchanged."""

import json

import pytest

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.training.trainer import Trainer


def losses_with(tmp_path, overrides):
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    Trainer(root, tmp_path, batch).fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in records if "train/loss" in r]


@pytest.mark.slow
def test_checkpointing_leaves_the_losses_unchanged(tmp_path, fast_overrides):
    base = fast_overrides + ["trainer.max_steps=6", "trainer.log_interval=1", "model=llama_debug",
                             "model.max_seq_len=64", "trainer.sample_tokens=0", "trainer.eval_interval=0"]
    reference = losses_with(tmp_path / "none", base)
    for variant in (["activation_checkpointing=full"], ["activation_checkpointing=every_k"],
                    ["activation_checkpointing=full", "activation_checkpointing.cpu_offload=true"]):
        assert losses_with(tmp_path / "_".join(variant).replace("=", "-"), base + variant) == reference, variant
