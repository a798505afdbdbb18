"""Data-parallel strategies: one class per mechanism, chosen once per run from one table.

| strategy | mechanism | chosen when (first row that matches) |
|---|---|---|
| none | nothing to replicate or shard | one data-parallel rank (dp x sp = 1), without offload |
| zero1_boundary | gradients all-reduced at the boundary (no wrapper), optimizer state partitioned, owners broadcast the updated parameters | zero.stage=1 with pipeline or expert parallelism |
| allreduce | one flat gradient all-reduce per step, no wrapper | pipeline parallelism (a schedule runs the stages), or tensor x sequence parallelism at zero.stage=0 (DDP takes no DTensors) |
| onebit | DDP until the 1-bit optimizer's freeze, then its compressed momentum all-reduce (data_parallel/onebit.py) | optimizer onebitadam / zerooneadam / onebitlamb with zero.stage=0 |
| ddp | DistributedDataParallel | zero.stage=0 |
| zero1 | DDP + ZeroRedundancyOptimizer | zero.stage=1 |
| zero2 | replicated parameters, bucketed gradient reduce-scatter, sharded optimizer (DeepSpeed's layout) | zero.stage=2 over plain data parallelism, without qgZ |
| fsdp2 | FSDP2 fully_shard (ZeRO++'s qwZ/qgZ/hpZ as its custom comms; CPU / NVMe offload) | zero.stage=3, or stage 2 with tp/sp/ep, hybrid sharding, offload or qgZ (zero.zero_quantized_gradients); offload at one rank too |

Adding a mechanism (compressed all-reduce, quantized ZeRO collectives, NVMe placement ...):

1. a new file here with a subclass of `base.DataParallelStrategy` overriding what the mechanism does
   differently: `wrap` (the model), `adopt_optimizer` (partitioning), `before_forward` (the
   accumulation sync boundary), `reduce_gradients` / `grad_norm` / `scale_grads` / `after_step`
   (the step), the checkpoint hooks (`state_module`, `full_state_dict`, `load_full_state`,
   `after_load`, `full_state_checkpoints`), `describe` (the run log) and `model_state_bytes` (the
   memory estimator);
2. one entry in STRATEGIES below, and one row in CHOICE saying when it is used (a config key,
   usually). Refused combinations belong in dsrecipes.config.compatibility, not here.
"""  # noqa: E501 - a markdown table row (zero2) cannot be wrapped without breaking the table

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dsrecipes.distributed.config import offloads
from dsrecipes.distributed.data_parallel.allreduce import BoundaryAllReduceStrategy
from dsrecipes.distributed.data_parallel.base import DataParallelStrategy, GradientLayout, ModelStateBytes
from dsrecipes.distributed.data_parallel.ddp import DDPStrategy
from dsrecipes.distributed.data_parallel.fsdp2 import FSDP2Strategy
from dsrecipes.distributed.data_parallel.onebit import ONEBIT_OPTIMIZERS, OneBitStrategy
from dsrecipes.distributed.data_parallel.zero1 import ZeroStage1Strategy
from dsrecipes.distributed.data_parallel.zero1_boundary import BoundaryZeroStage1Strategy
from dsrecipes.distributed.data_parallel.zero2 import ReplicatedZeroStage2Strategy

STRATEGIES: dict[str, type[DataParallelStrategy]] = {
    "none": DataParallelStrategy,
    "zero1_boundary": BoundaryZeroStage1Strategy,
    "allreduce": BoundaryAllReduceStrategy,
    "onebit": OneBitStrategy,
    "ddp": DDPStrategy,
    "zero1": ZeroStage1Strategy,
    "zero2": ReplicatedZeroStage2Strategy,
    "fsdp2": FSDP2Strategy,
}


def _plain_data_parallel(zero, dims) -> bool:
    return not (dims.model_parallel or dims.ep > 1 or offloads(zero) or dims.dp_replicate > 1)


@dataclass(frozen=True)
class Choice:
    strategy: str
    when: str  # in words, for the docs and the run log
    applies: Callable  # (zero: ZeroConfig, dims: ParallelDims) -> bool
    optimizers: tuple[str, ...] = ()  # non-empty: the row applies only to these optimizer options


CHOICE: tuple[Choice, ...] = (
    Choice("none", "one data-parallel rank (dp x sp = 1), without offload",
           lambda zero, dims: dims.dp_sp == 1 and not offloads(zero)),
    Choice("zero1_boundary", "zero.stage=1 with pipeline or expert parallelism",
           lambda zero, dims: zero.stage == 1 and (dims.pp > 1 or dims.ep > 1)),
    Choice("allreduce", "pipeline parallelism at zero.stage 0, or tensor x sequence parallelism at zero.stage=0",
           lambda zero, dims: (dims.pp > 1 and zero.stage < 2) or (dims.tp > 1 and dims.sp > 1 and zero.stage == 0)),
    Choice("onebit", "optimizer onebitadam / zerooneadam / onebitlamb with zero.stage=0",
           lambda zero, dims: zero.stage == 0, ONEBIT_OPTIMIZERS),
    Choice("ddp", "zero.stage=0", lambda zero, dims: zero.stage == 0),
    Choice("zero1", "zero.stage=1", lambda zero, dims: zero.stage == 1),
    Choice("zero2", "zero.stage=2 over plain data parallelism, without qgZ",
           lambda zero, dims: zero.stage == 2 and _plain_data_parallel(zero, dims)
           and not getattr(zero, "zero_quantized_gradients", False)),
    Choice("fsdp2", "zero.stage=3, or stage 2 with tp/sp/ep, hybrid sharding, offload or qgZ",
           lambda zero, dims: zero.stage >= 2),
)


def choose_strategy(zero, dims, optimizer: str | None = None) -> str:
    """The name of the data-parallel strategy for this ZeRO config, layout and optimizer option name
    (the first CHOICE row that applies)."""
    for choice in CHOICE:
        if choice.optimizers and optimizer not in choice.optimizers:
            continue
        if choice.applies(zero, dims):
            return choice.strategy
    raise AssertionError(f"no data-parallel strategy for zero.stage={zero.stage}")  # the last row covers stage >= 2


def build_strategy(zero, dims, precision, device, layout: GradientLayout | None = None,
                   optimizer: str | None = None) -> DataParallelStrategy:
    """The strategy object for this run (its meshes come from `dims`; optimizer: the optimizer option's name)."""
    return STRATEGIES[choose_strategy(zero, dims, optimizer)](dims, zero, precision, device, layout)


__all__ = ["CHOICE", "STRATEGIES", "DataParallelStrategy", "GradientLayout", "ModelStateBytes", "build_strategy",
           "choose_strategy"]
