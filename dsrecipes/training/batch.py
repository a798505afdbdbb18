"""DeepSpeed's batch-size triple: train_batch_size = micro_batch_per_gpu x gradient_accumulation x dp.

Only the keys the user gave count, as in DeepSpeed (`DeepSpeedConfig._set_batch_related_parameters`):
all three given are only checked; any two determine the third given the data-parallel world size
(DeepSpeed's floor divisions included); train_batch_size alone means accumulation 1 and micro =
train // dp; the micro-batch alone means accumulation 1 and train = micro x dp.

Two deliberate differences from DeepSpeed:

* no batch key at all trains with DEFAULT_MICRO_BATCH_SIZE (16) per rank and no accumulation
  (DeepSpeed asserts), so `python -m dsrecipes` and `dsrecipes.initialize(model)` run without one.
  The schema defaults of the three keys are null for that reason: a default value would count as
  given and turn `trainer.train_batch_size=8` into an over-determined triple;
* gradient_accumulation_steps alone, or any mismatch, is a ValueError naming the keys and showing
  the arithmetic (DeepSpeed: AssertionError).
"""

from __future__ import annotations

from dataclasses import dataclass

# The micro-batch per rank when no batch key is given (accumulation 1): the default recipe's 16 x 128 tokens.
DEFAULT_MICRO_BATCH_SIZE = 16


@dataclass(frozen=True)
class BatchSizes:
    train_batch_size: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    dp_world_size: int


def resolve_batch_sizes(
    train_batch_size: int | None,
    micro_batch_size: int | None,
    gradient_accumulation_steps: int | None,
    dp_world_size: int = 1,
    prefix: str = "trainer",
) -> BatchSizes:
    """Fill in the members the user left out (None) exactly as DeepSpeed does, then check the triple."""
    tb, mb, gas, world = train_batch_size, micro_batch_size, gradient_accumulation_steps, dp_world_size
    keys = (
        f"{prefix}.train_batch_size",
        f"{prefix}.train_micro_batch_size_per_gpu",
        f"{prefix}.gradient_accumulation_steps",
    )
    if world <= 0:
        raise ValueError(f"data-parallel world size must be > 0, got {world}")
    for key, value in zip(keys, (tb, mb, gas)):
        if value is not None and value <= 0:
            raise ValueError(f"{key}={value} must be > 0 (or null to infer it)")
    if tb is not None and mb is not None and gas is not None:
        pass
    elif tb is not None and mb is not None:
        gas = (tb // mb) // world
    elif tb is not None and gas is not None:
        mb = (tb // world) // gas
    elif mb is not None and gas is not None:
        tb = mb * gas * world
    elif tb is not None:
        gas, mb = 1, tb // world
    elif mb is not None:
        gas, tb = 1, mb * world
    elif gas is not None:
        raise ValueError(
            f"{keys[2]}={gas} alone does not determine the batch: set {keys[0]} or {keys[1]} as well "
            f"(or no batch key at all for {DEFAULT_MICRO_BATCH_SIZE} per rank; DeepSpeed asserts 'Either "
            "train_batch_size or train_micro_batch_size_per_gpu needs to be provided')"
        )
    else:  # no batch key given: dsrecipes' default (DeepSpeed asserts)
        mb, gas = DEFAULT_MICRO_BATCH_SIZE, 1
        tb = mb * world

    if mb <= 0 or gas <= 0 or tb != mb * gas * world:
        raise ValueError(
            "inconsistent batch sizes: train_batch_size must equal "
            "micro_batch_per_gpu x gradient_accumulation_steps x data_parallel_world_size, but "
            f"{tb} != {mb} x {gas} x {world} = {mb * gas * world} "
            f"(given: {keys[0]}={train_batch_size}, {keys[1]}={micro_batch_size}, "
            f"{keys[2]}={gradient_accumulation_steps}, dp world size={world})"
        )
    return BatchSizes(tb, mb, gas, world)
