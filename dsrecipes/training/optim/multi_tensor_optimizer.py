"""Shared skeleton of dsrecipes' own optimizers (LAMB, Lion): closure, gradient gathering, foreach choice.

A subclass says how to create a parameter's state (`init_state`) and supplies two update paths over
the gathered lists, a multi-tensor (`torch._foreach_*`) one and a per-tensor loop, which must agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch


class MultiTensorOptimizer(torch.optim.Optimizer):
    def init_state(self, param: torch.Tensor, state: dict) -> None:
        raise NotImplementedError

    def update_foreach(self, params: list, grads: list, states: list, group: dict) -> None:
        raise NotImplementedError

    def update_loop(self, params: list, grads: list, states: list, group: dict) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        """One update of every parameter that has a gradient; returns closure()'s loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, states = [], [], []
            for p, state in params_with_grads(self, group):
                params.append(p)
                grads.append(p.grad)
                states.append(state)
            if not params:
                continue
            foreach = group["foreach"]
            if foreach is None:
                foreach = all(p.is_cuda for p in params)
            (self.update_foreach if foreach else self.update_loop)(params, grads, states, group)
        return loss


def params_with_grads(optimizer, group: dict) -> Iterator[tuple[torch.Tensor, dict]]:
    """(parameter, state) of every parameter of `group` with a dense gradient, in order, its state created by
    optimizer.init_state(p, state) on first use; a sparse gradient is refused (the fused updates are dense)."""
    for p in group["params"]:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            raise RuntimeError(f"{type(optimizer).__name__} does not support sparse gradients")
        state = optimizer.state[p]
        if not state:
            optimizer.init_state(p, state)
        yield p, state
