"""DeepSpeed's batch-size triple: train_batch_size = micro_batch_per_gpu x gradient_accumulation x dp.

Any two determine the third given the data-parallel world size (DeepSpeed's inference table, floor
division included); with all three given they must agree. Unlike DeepSpeed, a mismatch is a
ValueError that shows the arithmetic rather than an AssertionError.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """Fill in the missing member(s) of the triple exactly as DeepSpeed does, then check it."""
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
    else:
        raise ValueError(f"set {keys[0]} or {keys[1]} (with or without {keys[2]}); both are null")

    if mb <= 0 or gas <= 0 or tb != mb * gas * world:
        raise ValueError(
            "inconsistent batch sizes: train_batch_size must equal "
            "micro_batch_per_gpu x gradient_accumulation_steps x data_parallel_world_size, but "
            f"{tb} != {mb} x {gas} x {world} = {mb * gas * world} "
            f"(given: {keys[0]}={train_batch_size}, {keys[1]}={micro_batch_size}, "
            f"{keys[2]}={gradient_accumulation_steps}, dp world size={world})"
        )
    return BatchSizes(tb, mb, gas, world)
