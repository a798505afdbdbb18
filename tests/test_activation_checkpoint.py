"""Activation checkpointing: same losses, fewer saved activation bytes, state-dict keys unchanged."""

import json

import pytest
import torch
from hydra.errors import ConfigCompositionException

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.distributed.activation_checkpoint import (
    ActivationCheckpointConfig,
    apply_activation_checkpointing,
    saved_activation_bytes,
    validate_activation_checkpoint_config,
)
from dsrecipes.models import GPT, load_flavor
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


def test_saved_activation_bytes_shrink():
    ids = torch.randint(0, 257, (4, 128))
    measured = {}
    for mode in ("none", "every_k", "full"):
        torch.manual_seed(0)
        model = GPT(load_flavor("gpt_debug", vocab_size=320))
        keys = list(model.state_dict())
        assert apply_activation_checkpointing(model, ActivationCheckpointConfig(mode=mode)) == \
            {"none": 0, "every_k": 2, "full": 4}[mode]
        assert list(model.state_dict()) == keys
        measured[mode] = saved_activation_bytes(model, ids, labels=ids)
    assert measured["full"] < measured["every_k"] < measured["none"]
    assert measured["full"] < 0.25 * measured["none"]


def test_bad_mode_is_rejected():
    with pytest.raises(ConfigCompositionException) as err:  # at composition: mode is an Enum (ACMode)
        compose(["activation_checkpointing.mode=some"])
    message = str(err.value.__cause__)
    assert "Invalid value 'some', expected one of [none, full, every_k]" in message
    assert "full_key: activation_checkpointing.mode" in message
    # a Python user's plain string is checked by the validator
    with pytest.raises(ValueError, match="activation_checkpointing.mode='some' is not valid; choose one of: none, full, every_k"):
        validate_activation_checkpoint_config(ActivationCheckpointConfig(mode="some"))
