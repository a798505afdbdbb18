"""ZeRO stage 2 in DeepSpeed's layout: replicated parameters, sharded gradients and optimizer states.

The mechanism itself is dsrecipes.distributed.data_parallel.zero2_buckets.ZeroStage2 (gradient buckets reduced during
backward into per-rank fp32 shards, the optimizer stepping `Shard(0)` DTensor masters, one bucketed
all-gather after the step); this strategy plugs it into the Engine. It serves plain data
parallelism; with tensor/sequence/expert parallelism, hybrid sharding or CPU offload stage 2 runs on
FSDP2 instead (the choice table in dsrecipes.distributed.data_parallel).
"""

from __future__ import annotations

import torch
from torch import nn

from dsrecipes.distributed.data_parallel.base import DataParallelStrategy, ModelStateBytes
from dsrecipes.distributed.data_parallel.zero2_buckets import ZeroStage2


class ReplicatedZeroStage2Strategy(DataParallelStrategy):
    name = "zero2"
    description = "ZeRO-2: parameters replicated, gradients and optimizer state sharded"

    @property
    def keeps_module_masters(self) -> bool:
        return False  # the rank's fp32 shards are the masters

    def wrap(self, model: nn.Module, ignored_params: set[nn.Parameter] | None = None) -> nn.Module:
        low_precision = self.precision.compute_dtype if self.precision.master_weights else None
        self.zero2 = ZeroStage2(model, self.dims.get_mesh("dp"), low_precision,
                                keep_dtype=getattr(self.precision, "bf16_masters", False))
        self.unwrapped = self.module = model
        return model

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer, built over the model's parameters, now steps their sharded masters."""
        self.optimizer = self.zero2.shard_optimizer(optimizer)
        return self.optimizer

    def reduce_gradients(self) -> None:
        """Nothing left to do: the buckets were reduced into the shards during backward."""

    def grad_norm(self) -> torch.Tensor:
        return self.zero2.grad_norm()  # the flat shard buffers: one norm per bucket, one all-reduce

    def scale_grads(self, factor: float) -> None:
        self.zero2.scale_grads(factor)

    def after_step(self) -> None:
        self.zero2.gather_params()  # every rank's updated shard into every rank's parameters

    def optimizer_copies(self) -> dict[int, list[torch.Tensor]]:
        """The sharded masters (views of the parameters in fp32, separate fp32 copies with master weights):
        masking only the parameters would be undone by the next gather_params."""
        return {key: [master] for key, master in self.zero2.masters().items()}

    @property
    def state_module(self) -> nn.Module:
        return self.zero2.shadow  # the model's names holding the sharded masters

    def load_full_state(self, model_state: dict, optimizer_state_loader) -> None:
        if optimizer_state_loader is not None:
            raise ValueError("this checkpoint holds full-state (ZeRO-1 / master-weight) optimizer state, which "
                             "zero.stage=2 cannot take; resume it with the zero.stage and precision that wrote it")
        super().load_full_state(model_state, None)

    def after_load(self) -> None:
        self.zero2.gather_params()

    def describe(self) -> str:
        return (f"ZeRO-2: parameters replicated, gradients and optimizer state sharded over {self.zero2.world} "
                f"ranks ({len(self.zero2.buckets)} gradient bucket(s))")

    @classmethod
    def shard_ranks(cls, dims) -> int:
        return dims.dp  # the "dp" mesh (plain data parallelism only)

    @classmethod
    def model_state_bytes(cls, num_params, world, model_bytes, state_bytes, master_weights) -> ModelStateBytes:
        masters = 4 * num_params / world if master_weights else 0
        return ModelStateBytes(model_bytes * num_params + masters, 4 * num_params / world,
                               state_bytes * num_params / world)
