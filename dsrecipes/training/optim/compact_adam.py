"""Adam / AdamW with bf16 moments: optimizer.state_dtype=bf16 for optimizer=adamw and optimizer=adam.

What: `CompactAdam` is torch's Adam update (AdamW's decoupled weight decay when `decoupled`, Adam's L2 otherwise)
whose two moments are stored in bf16, 4 bytes per parameter instead of 8. Each step reads them into fp32, updates
them and the parameter in fp32 (the parameters, masters included, stay in the dtype they have), and stores them
back by stochastic rounding (dsrecipes.training.optim.stochastic_rounding): rounded to nearest, a second moment
that changes by (1 - beta2) g^2 ~ 1e-3 of itself per step would stall at bf16's 2^-8 resolution; rounded
stochastically it moves by the right amount on average.

The rounding noise is a hash of each element's place in the whole tensor and of the step, so ZeRO-3 at any world
size rounds as one process does and a resumed run as the straight run did (the checkpoint holds the bf16 moments
and the step, nothing else). State: ``step`` (a CPU float tensor, torch's convention), ``exp_avg`` and
``exp_avg_sq`` (bf16, shaped and sharded like the parameter).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from dsrecipes.training.optim.stochastic_rounding import global_flat_index, round_to_bf16


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class CompactAdam(torch.optim.Optimizer):
    """Adam with bf16 moments and stochastic rounding (see the module docstring)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, decoupled: bool = True):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, decoupled=decoupled)
        super().__init__(params, defaults)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load, then the moments back in bf16 (torch casts a floating state to its parameter's dtype)."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state and state[key].dtype != torch.bfloat16:
                    state[key] = state[key].to(torch.bfloat16)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._step_one(p, group)
        return loss

    def _step_one(self, p: torch.Tensor, group: dict) -> None:
        lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16, memory_format=torch.preserve_format)
        state["step"] += 1
        step = int(state["step"].item())
        param, grad = _local(p), _local(p.grad).float()
        stored_avg, stored_sq = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
        if decay and group["decoupled"]:
            param.mul_(1 - lr * decay)
        elif decay:
            grad = grad.add(param.float(), alpha=decay)
        exp_avg = stored_avg.float().lerp_(grad, 1 - beta1)
        exp_avg_sq = stored_sq.float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / (1 - beta2 ** step) ** 0.5).add_(eps)
        param.add_((exp_avg / denom).to(param.dtype), alpha=-lr / (1 - beta1 ** step))
        index = global_flat_index(p)
        stored_avg.copy_(round_to_bf16(exp_avg, index, 2 * step))
        stored_sq.copy_(round_to_bf16(exp_avg_sq, index, 2 * step + 1))
