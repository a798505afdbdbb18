"""What 1-bit Adam, 0/1 Adam and 1-bit LAMB share: the process group, the compression errors, the
momentum masks, the step count, checkpoint handling and the question the data-parallel strategy asks.

These optimizers communicate themselves once compression starts (DeepSpeed's
`enable_backward_allreduce = False`): the data-parallel strategy (dsrecipes.distributed.
data_parallel.onebit) all-reduces the gradients as DDP does while `needs_gradient_allreduce()` is
true, turns DDP's gradient sync off when it is false, and hands the optimizer its data-parallel
process group (`set_process_group`). Without a group (one process, or another strategy) nothing is
compressed: the optimizer is then its warm-up update with a frozen variance, as DeepSpeed's at
world size 1.

Deliberate difference from DeepSpeed: DeepSpeed's first step() call is an initialisation step that
allocates buffers and moves no weight (its counters then run one ahead); here the first call is a
real step, so `freeze_step` counts updates (freeze_step=N: N uncompressed Adam/LAMB updates).

Checkpoints: the compression errors are kept out of state_dict() and reset by load_state_dict(), as
DeepSpeed does (each rank's errors differ, only one rank would be saved, and they need the same
world size; DeepSpeed verified on BERT that an occasional reset does not hurt convergence, but
frequent reloads break the error compensation). Momentum masks (`exp_avg_mask` in a param group,
DeepSpeed's key: a 0/1 tensor the shape of the group's parameters, for entries whose gradient is
always zero, which 1-bit compression cannot represent) are not saved either: load_state_dict keeps
the ones the current param groups hold, as DeepSpeed keeps the user's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from dsrecipes.distributed.compressed_allreduce import CompressionErrors, compressed_allreduce
from dsrecipes.training.optim.multi_tensor_optimizer import params_with_grads

__all__ = ["OneBitOptimizer", "check_onebit_hyperparameters"]


def check_onebit_hyperparameters(name: str, lr: float, betas, eps: float, weight_decay: float,
                                 **steps: int) -> None:
    """ValueError on a value no step can use; `steps` are the step-count keys (freeze_step=..., ...)."""
    if not lr > 0.0:
        raise ValueError(f"{name}: lr={lr} must be > 0")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"{name}: betas={tuple(betas)} must be two values in [0, 1)")
    if eps < 0.0 or weight_decay < 0.0:
        raise ValueError(f"{name}: eps={eps} and weight_decay={weight_decay} must be >= 0")
    for key, value in steps.items():
        minimum = 0 if key == "var_freeze_step" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            why = " (the variance is frozen at the end of the warm-up: at least one uncompressed step)" \
                if key == "freeze_step" else ""
            raise ValueError(f"{name}: {key}={value!r} must be an integer >= {minimum}{why}")


class OneBitOptimizer(torch.optim.Optimizer):
    """Base of the 1-bit optimizers (see the module docstring). Subclasses implement step() and
    `needs_gradient_allreduce`."""

    def __init__(self, params, defaults: dict):
        super().__init__(params, defaults)
        self.process_group = None
        self._errors: dict[object, CompressionErrors] = {}

    # ------------------------------------------------------------------ communication
    def set_process_group(self, group) -> None:
        """The data-parallel group to average the momentum over (the strategy calls this)."""
        self.process_group = group
        self._errors.clear()

    @property
    def world_size(self) -> int:
        if self.process_group is None or not dist.is_initialized():
            return 1
        return dist.get_world_size(self.process_group)

    def needs_gradient_allreduce(self) -> bool:
        """Whether the coming step reads gradients averaged over the data-parallel ranks (DDP's
        all-reduce on), or this rank's own (the optimizer compresses what it sends)."""
        raise NotImplementedError

    def compress_(self, tensor: torch.Tensor, key: object) -> torch.Tensor:
        """`tensor` replaced by its 1-bit compressed average over the group (errors kept under `key`);
        unchanged without a group of two or more ranks."""
        world = self.world_size
        if world == 1:
            return tensor
        errors = self._errors.get(key)
        if errors is None:
            errors = self._errors[key] = CompressionErrors.for_tensor(tensor.numel(), world, tensor.device)
        return compressed_allreduce(tensor, errors, self.process_group)

    def reset_compression_errors(self) -> None:
        """Forget every worker / server error (on reload; 0/1 Adam when its variance freezes)."""
        self._errors.clear()

    @property
    def compression_errors(self) -> dict[object, CompressionErrors]:
        """The error buffers by key (a parameter, or "flat" for 1-bit LAMB's one fused buffer)."""
        return self._errors

    @staticmethod
    def apply_mask_(group: dict, tensor: torch.Tensor) -> None:
        """Multiply `tensor` by the group's exp_avg_mask, if it has one (moved to the tensor's device once)."""
        mask = group.get("exp_avg_mask")
        if mask is None:
            return
        if mask.device != tensor.device:
            mask = group["exp_avg_mask"] = mask.to(tensor.device)
        tensor.mul_(mask)

    # ------------------------------------------------------------------ steps
    @staticmethod
    def closure_loss(closure: Callable[[], torch.Tensor] | None):
        """closure()'s loss computed with gradients on (torch.optim's convention), or None."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def init_state(self, p: torch.Tensor, state: dict) -> None:
        """A parameter's first state: the step count and both moments (subclasses add their own keys)."""
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def params_to_step(self, group: dict) -> Iterator[tuple[torch.Tensor, dict]]:
        """(parameter, state) of every parameter of `group` with a dense gradient, its state created on
        first use and its step count advanced; a sparse gradient is refused."""
        for p, state in params_with_grads(self, group):
            state["step"] += 1
            yield p, state

    def steps_taken(self) -> int:
        """Updates taken so far (the largest per-parameter step: a parameter without gradient lags)."""
        steps = [int(state["step"]) for state in self.state.values() if "step" in state]
        return max(steps, default=0)

    @staticmethod
    def bias_corrections(step: int, beta1: float, beta2: float, enabled: bool) -> tuple[float, float]:
        """(1 - beta1^t, sqrt(1 - beta2^t)), or (1, 1) without bias correction (DeepSpeed's update)."""
        if not enabled:
            return 1.0, 1.0
        return 1.0 - beta1**step, (1.0 - beta2**step) ** 0.5

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """torch's state dict without the momentum masks (and never the compression errors)."""
        state = super().state_dict()
        state["param_groups"] = [{k: v for k, v in g.items() if k != "exp_avg_mask"} for g in state["param_groups"]]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Load the moments and counters; keep the current groups' masks; reset the compression errors."""
        masks = [group.get("exp_avg_mask") for group in self.param_groups]
        groups = [{k: v for k, v in g.items() if k != "exp_avg_mask"} for g in state_dict["param_groups"]]
        super().load_state_dict({**state_dict, "param_groups": groups})
        for group, mask in zip(self.param_groups, masks):
            group.pop("exp_avg_mask", None)
            if mask is not None:
                group["exp_avg_mask"] = mask
        self.reset_compression_errors()
