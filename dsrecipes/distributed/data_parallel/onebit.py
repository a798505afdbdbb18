"""The `onebit` data-parallel strategy: DDP until the 1-bit optimizer's freeze, then no gradient all-reduce.

Chosen (data_parallel's CHOICE table) when the optimizer is onebitadam, zerooneadam or onebitlamb with
zero.stage=0 and more than one data-parallel rank:

    python -m dsrecipes optimizer=onebitadam optimizer.freeze_step=50 launcher.nproc_per_node=2

It is DDP (dsrecipes.distributed.data_parallel.ddp) with one difference, DeepSpeed's
`enable_backward_allreduce` switch: before each micro-batch it asks the optimizer whether the coming
step reads averaged gradients (`needs_gradient_allreduce()`, dsrecipes.training.optim.onebit_base). While
it does (1-bit Adam / LAMB's warm-up, 0/1 Adam's variance-update steps) DDP all-reduces the
gradients at the accumulation boundary as usual; afterwards DDP's gradient sync stays off and each
rank keeps its own gradient: the optimizer averages its momentum itself with the 1-bit compressed
all-reduce over the process group this strategy hands it in `adopt_optimizer`. (DDP then also
skips its forward buffer broadcast, which it only does on synchronising iterations.)

Gradient clipping and the overflow check without the all-reduce: as DeepSpeed (whose engine clips
whatever gradients the optimizer is given), each rank clips its own local gradient by its own norm
(trainer.gradient_clipping), and train/grad_norm is rank 0's local norm. The overflow verdict must
be the same on every rank, or one rank would skip a step the others take: one 1-element all-reduce
(MAX of a non-finite flag) per step makes it so.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

from dsrecipes.distributed.data_parallel.ddp import DDPStrategy

ONEBIT_OPTIMIZERS = ("onebitadam", "zerooneadam", "onebitlamb")


@runtime_checkable
class CompressingOptimizer(Protocol):
    """What this strategy needs of the optimizer (dsrecipes.training.optim.onebit_base.OneBitOptimizer has it):
    described here, so the distributed layer does not import the training layer above it."""

    def set_process_group(self, group) -> None: ...

    def needs_gradient_allreduce(self) -> bool: ...


class OneBitStrategy(DDPStrategy):
    name = "onebit"
    description = ("1-bit: DDP until the optimizer's freeze step, then each rank's own gradients and the "
                   "momentum averaged by the optimizer's 1-bit compressed all-reduce")

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if not isinstance(optimizer, CompressingOptimizer):
            raise ValueError(f"the onebit data-parallel strategy needs one of the optimizers {', '.join(ONEBIT_OPTIMIZERS)}; "
                             f"got {type(optimizer).__name__}")
        optimizer.set_process_group(self.group)
        return super().adopt_optimizer(optimizer)

    def _averaged(self) -> bool:
        return self.optimizer is None or self.optimizer.needs_gradient_allreduce()

    def before_forward(self, boundary: bool) -> None:
        self.module.require_backward_grad_sync = boundary and self._averaged()

    def grad_norm(self) -> torch.Tensor:
        norm = super().grad_norm()
        if self._averaged():
            return norm  # averaged gradients: the same norm on every rank
        flag = (~torch.isfinite(norm)).to(torch.float32).reshape(1)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return torch.where(flag[0] > 0, torch.full_like(norm, float("inf")), norm)

    def describe(self) -> str:
        step = getattr(self.optimizer, "freeze_step", None) or getattr(self.optimizer, "var_freeze_step", None)
        extra = f" (optimizer {type(self.optimizer).__name__}, freeze at step {step})" if step is not None else ""
        return super().describe().replace(DDPStrategy.description, self.description) + extra
