"""Named phases of a training step (data, forward, backward, grad_reduce, optimizer), observable by profilers.

The Engine and its step runner mark where each phase of a step runs:

    with engine.phases("forward"):
        out = module(input_ids, labels=labels)

With no observer attached (the default) a phase costs one attribute test and a shared null context,
so marking them is free. Observers (the wall-clock breakdown, the flops profiler's forward counter,
the trace profiler's labels) each return a context manager per phase; `engine.phases.add(observer)`
attaches one, `remove` detaches it. The phases and what they hold:

* data: the Trainer drawing and moving a micro-batch (its `_micro_batch`).
* forward: `engine(...)`: the model's forward under autocast (DDP/FSDP2 pre-forward work included).
* backward: `engine.backward(loss)`. The gradient reduction that DDP, FSDP2 and the ZeRO-2 buckets
  overlap with backward (their hooks fire inside it) is counted here: it cannot be separated
  without losing the overlap.
* grad_reduce: the strategy's explicit reduction at the accumulation boundary
  (`strategy.reduce_gradients()`: the all-reduce of the plain all-reduce strategy, copying gradients
  into fp32 master weights, the expert-parallel reduction); empty for DDP / FSDP2 / ZeRO-2.
* optimizer: the global norm (one small all-reduce), unscale and clip, optimizer.step, the
  post-step work (ZeRO-2's parameter all-gather, master-to-model copy), the LR schedule, zero_grad.
* forward_backward: under pipeline parallelism the schedule runs both; they are one phase there.
* eval_forward: `engine(...)` with the module in eval mode (validation, not a training step).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

PHASES = ("data", "forward", "backward", "grad_reduce", "optimizer", "forward_backward", "eval_forward")
TRAINING_PHASES = PHASES[:-1]

Observer = Callable[[str], AbstractContextManager]
_NULL = contextlib.nullcontext()


class StepPhases:
    """The Engine's phase markers: `phases(name)` is a context manager; observers see every phase."""

    def __init__(self) -> None:
        self._observers: list[Observer] = []

    def __call__(self, name: str) -> AbstractContextManager:
        if not self._observers:
            return _NULL
        if len(self._observers) == 1:
            return self._observers[0](name)
        stack = contextlib.ExitStack()
        for observer in self._observers:
            stack.enter_context(observer(name))
        return stack

    def add(self, observer: Observer) -> None:
        self._observers.append(observer)

    def remove(self, observer: Observer) -> None:
        if observer in self._observers:
            self._observers.remove(observer)

    @property
    def observed(self) -> bool:
        return bool(self._observers)
