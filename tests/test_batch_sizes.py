"""DeepSpeed's batch-size triple: inference table, consistency errors that show the arithmetic."""

import pytest

from dsrecipes.training.batch import resolve_batch_sizes


@pytest.mark.parametrize(
    "given, world, expected",
    [
        ((32, 16, 1), 2, (32, 16, 1)),  # DeepSpeed's TestBatchConfig: ok
        ((32, 8, 2), 2, (32, 8, 2)),  # ok
        ((32, 16, None), 2, (32, 16, 1)),  # TB + MB -> GAS
        ((32, None, 2), 2, (32, 8, 2)),  # TB + GAS -> MB
        ((None, 4, 3), 2, (24, 4, 3)),  # MB + GAS -> TB
        ((64, None, None), 4, (64, 16, 1)),  # TB only -> GAS 1
        ((None, 8, None), 3, (24, 8, 1)),  # MB only -> GAS 1
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


def test_neither_tb_nor_mb():
    with pytest.raises(ValueError, match="train_batch_size or trainer.train_micro_batch_size_per_gpu"):
        resolve_batch_sizes(None, None, 4)


def test_non_positive_values_name_the_key():
    with pytest.raises(ValueError, match="trainer.gradient_accumulation_steps=0"):
        resolve_batch_sizes(32, 16, 0)
