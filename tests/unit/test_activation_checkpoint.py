"""Activation checkpointing: same losses, fewer saved activation bytes, state-dict keys unchanged."""


import pytest
import torch
from hydra.errors import ConfigCompositionException

from dsrecipes.config.store import compose
from dsrecipes.distributed.activation_checkpoint import (
    ActivationCheckpointConfig,
    apply_activation_checkpointing,
    saved_activation_bytes,
    validate_activation_checkpoint_config,
)
from dsrecipes.models import GPT, load_flavor


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
