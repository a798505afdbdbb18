"""ZeRO stage 1: DDP for the gradients plus torch's ZeroRedundancyOptimizer for the optimizer states.

Each rank steps its shard of the optimizer state (and, with precision.master_weights, of the fp32
masters), then the updated parameters are broadcast from their owners as one flat bucket per rank
(`parameters_as_bucket_view`). Its optimizer state has no DCP description, so checkpoints are
consolidated on rank 0 (model.pt / optimizer.pt) and resume at stage 1 with the same precision.
"""

from __future__ import annotations

import inspect

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from dsrecipes.distributed.data_parallel.base import ModelStateBytes
from dsrecipes.distributed.data_parallel.ddp import DDPStrategy


class ZeroStage1Strategy(DDPStrategy):
    name = "zero1"
    description = "DDP + ZeroRedundancyOptimizer: optimizer state sharded"
    full_state_checkpoints = True

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Rebuild `optimizer` as a ZeroRedundancyOptimizer of the same class, groups and defaults."""
        groups = optimizer.param_groups
        accepted = inspect.signature(type(optimizer).__init__).parameters
        first = {k: v for k, v in {**optimizer.defaults, **groups[0]}.items() if k in accepted and k != "params"}
        # bucket views: each rank's parameters live in one flat buffer, so the post-step parameter sync is
        # one broadcast per rank instead of one per parameter (measured 34-37 -> 11-14 ms per step for
        # gpt_tiny at world size 2 on CPU)
        sharded = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=type(optimizer), process_group=self.group,
                                          parameters_as_bucket_view=True, **first)
        for group in groups[1:]:
            sharded.add_param_group(dict(group))
        self.optimizer = sharded
        return sharded

    def prepare_full_save(self) -> None:
        self.optimizer.consolidate_state_dict(to=0)

    @classmethod
    def shard_ranks(cls, dims) -> int:
        return dims.dp_sp  # the optimizer is partitioned over DDP's group (data x sequence parallel)

    @classmethod
    def model_state_bytes(cls, num_params, world, model_bytes, state_bytes, master_weights) -> ModelStateBytes:
        masters = 4 * num_params / world if master_weights else 0
        grads = 4 * num_params if master_weights else model_bytes * num_params
        return ModelStateBytes(model_bytes * num_params + masters, grads, state_bytes * num_params / world)
