"""DeepSpeed's batch-size triple: inference table, consistency errors that show the arithmetic.

Only the keys the user gives count (DeepSpeed's `_set_batch_related_parameters`), on the CLI
(`trainer.train_batch_size=8` alone) and in dsrecipes.initialize's dict alike; no key at all is
dsrecipes' default, 16 per rank. The hard-coded derivations were checked against DeepSpeed 0.19.8's
DeepSpeedConfig (tests/unit/test_deepspeed_parity.py compares the whole table where DeepSpeed is installed).
"""

import warnings

import pytest
import torch

import dsrecipes
from dsrecipes.config import validate_recipe
from dsrecipes.config.loading import load_config
from dsrecipes.config.store import compose
from dsrecipes.config.validate import to_root, validate_engine_config
from dsrecipes.training.batch import DEFAULT_MICRO_BATCH_SIZE, resolve_batch_sizes


@pytest.mark.parametrize(
    "given, world, expected",
    [
        ((32, 16, 1), 2, (32, 16, 1)),  # DeepSpeed's TestBatchConfig: ok
        ((32, 8, 2), 2, (32, 8, 2)),  # ok
        ((32, 16, None), 2, (32, 16, 1)),  # TB + MB -> GAS
        ((32, None, 2), 2, (32, 8, 2)),  # TB + GAS -> MB
        ((None, 4, 3), 2, (24, 4, 3)),  # MB + GAS -> TB
        ((64, None, None), 4, (64, 16, 1)),  # TB only -> GAS 1
        ((8, None, None), 1, (8, 8, 1)),  # TB only at world 1 and 2 (DeepSpeed: micro 8 / 4, accumulation 1)
        ((8, None, None), 2, (8, 4, 1)),
        ((None, 8, None), 3, (24, 8, 1)),  # MB only -> GAS 1
        ((None, None, None), 1, (16, 16, 1)),  # nothing given: dsrecipes' default (DeepSpeed asserts)
        ((None, None, None), 2, (32, 16, 1)),
    ],
)
def test_triple_inference(given, world, expected):
    b = resolve_batch_sizes(*given, dp_world_size=world)
    assert (b.train_batch_size, b.micro_batch_size, b.gradient_accumulation_steps) == expected
    assert b.train_batch_size == b.micro_batch_size * b.gradient_accumulation_steps * world


@pytest.mark.parametrize("given", [(33, 17, 2), (32, 18, 1)])
def test_inconsistent_triple_shows_arithmetic(given):
    with pytest.raises(ValueError) as err:
        resolve_batch_sizes(*given, dp_world_size=2)
    message = str(err.value)
    assert f"{given[0]} != {given[1]} x {given[2]} x 2" in message
    assert "trainer.train_batch_size" in message


def test_floor_division_mismatch_is_an_error():
    # TB=33, MB=16 at world 2: GAS = (33 // 16) // 2 = 1, and 16 x 1 x 2 = 32 != 33.
    with pytest.raises(ValueError, match="33 != 16 x 1 x 2"):
        resolve_batch_sizes(33, 16, None, dp_world_size=2)


def test_micro_batch_zero_when_tb_below_world():
    with pytest.raises(ValueError, match="2 != 0 x 1 x 4"):
        resolve_batch_sizes(2, None, 1, dp_world_size=4)


def test_accumulation_alone_names_the_keys():
    """DeepSpeed asserts 'Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided'."""
    with pytest.raises(ValueError) as err:
        resolve_batch_sizes(None, None, 4)
    message = str(err.value)
    assert "trainer.gradient_accumulation_steps=4 alone does not determine the batch" in message
    assert "trainer.train_batch_size or trainer.train_micro_batch_size_per_gpu" in message
    assert DEFAULT_MICRO_BATCH_SIZE == 16


@pytest.mark.parametrize(
    "overrides, world, expected",
    [
        ([], 1, (16, 16, 1)),  # the default recipe: 16 x 1 per rank, whatever the world size
        ([], 2, (32, 16, 1)),
        (["trainer.train_batch_size=64"], 2, (64, 32, 1)),  # DeepSpeed: GAS 1, micro 64 // 2
        (["trainer.train_batch_size=8"], 1, (8, 8, 1)),
        (["trainer.train_batch_size=64", "trainer.gradient_accumulation_steps=4"], 2, (64, 8, 4)),
        (["trainer.train_micro_batch_size_per_gpu=4", "trainer.gradient_accumulation_steps=2"], 2, (16, 4, 2)),
    ],
)
def test_command_line_counts_only_the_keys_given(overrides, world, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, b = validate_recipe(compose(overrides), dp_world_size=world)
    assert (b.train_batch_size, b.micro_batch_size, b.gradient_accumulation_steps) == expected


def test_command_line_accumulation_alone_is_refused():
    with pytest.raises(ValueError, match="trainer.gradient_accumulation_steps=2 alone does not determine the batch"):
        validate_recipe(compose(["trainer.gradient_accumulation_steps=2"]), dp_world_size=1)


@pytest.mark.parametrize(
    "trainer, world, expected",
    [
        ({}, 2, (32, 16, 1)),
        ({"train_batch_size": 8}, 1, (8, 8, 1)),
        ({"train_batch_size": 8}, 2, (8, 4, 1)),
        ({"train_batch_size": 12, "train_micro_batch_size_per_gpu": 3}, 2, (12, 3, 2)),
    ],
)
def test_library_dict_counts_only_the_keys_given(trainer, world, expected):
    b = validate_engine_config(to_root(load_config({"trainer": trainer})), world)
    assert (b.train_batch_size, b.micro_batch_size, b.gradient_accumulation_steps) == expected


def test_initialize_with_train_batch_size_alone():
    engine, _, loader, _ = dsrecipes.initialize(
        torch.nn.Linear(3, 2), config={"trainer": {"train_batch_size": 8, "device": "cpu"}},
        training_data=torch.utils.data.TensorDataset(torch.randn(20, 3)))
    assert (engine.train_batch_size, engine.train_micro_batch_size_per_gpu, engine.gradient_accumulation_steps) == (8, 8, 1)
    assert loader.batch_size == 8
    with pytest.raises(ValueError, match="gradient_accumulation_steps=2 alone"):
        dsrecipes.initialize(torch.nn.Linear(3, 2), config={"trainer": {"gradient_accumulation_steps": 2, "device": "cpu"}})


def test_non_positive_values_name_the_key():
    with pytest.raises(ValueError, match="trainer.gradient_accumulation_steps=0"):
        resolve_batch_sizes(32, 16, 0)
