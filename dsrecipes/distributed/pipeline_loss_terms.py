"""Extra loss terms inside pipeline stages (MoE auxiliary losses) under a pipeline schedule.

A pipeline schedule runs the backward of one loss, the language-model loss the last stage computes. A term
that arises inside an earlier stage (an MoE layer's load-balancing or router z-loss) would never reach that
backward. So each stage adds the gradient of its own terms where they arise: the stage's output passes
through `add_loss_gradient(x, term, scale)`, the identity in forward, whose backward also hands `term` the
gradient `scale` (the fp16 loss scale / the number of micro-batches, the factor the schedule's
language-model loss carries: PipelineParallel._scaled_loss), exactly as if `term` had been added to the
loss: what one process does with `(lm_loss + term) / gradient_accumulation_steps` (Megatron-LM's
MoEAuxLossAutoScaler does the same).

    terms = StageLossTerms([moe_loss_term])          # fn(module, batch, output) -> {name: scalar}, stage_local
    x = terms.apply(stage_module, x)                 # at the end of GPTStage.forward
    totals = terms.step_totals(pp_group, device)     # {name: sum over micro-batches and stages}, every rank alike

Only terms that read nothing but the module's state after its forward qualify (`stage_local = True` on the
function): a term that needs the batch or the logits (distillation) cannot be evaluated inside a stage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


class _AddLossGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, term: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale, ctx.term_dtype, ctx.term_device = scale, term.dtype, term.device
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, torch.full((), ctx.scale, dtype=ctx.term_dtype, device=ctx.term_device), None


def add_loss_gradient(x: torch.Tensor, term: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """x unchanged; its backward also gives `term` the gradient `scale` (term behaves as if added to the loss)."""
    return _AddLossGradient.apply(x, term, scale)


def is_stage_local(term: Callable) -> bool:
    return bool(getattr(term, "stage_local", False))


class StageLossTerms:
    def __init__(self, terms: list[Callable]):
        self.terms = list(terms)
        self.loss_scale = 1.0  # loss scale / micro-batches of the coming step, the language-model loss's factor (set
        # by PipelineParallel.train_step)
        self._values: list[dict[str, torch.Tensor]] = []
        self._recording = True
        self._names: list[str] | None = None  # every stage's term names, agreed on the first step

    @contextlib.contextmanager
    def paused(self):
        """A forward that is not a training pass (the schedule's shape inference) records nothing."""
        self._recording = False
        try:
            yield
        finally:
            self._recording = True

    def apply(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        # evaluation runs without autograd (the stage modules' own train/eval flags do not follow the engine's:
        # they share their blocks with the module the engine switches, not their parent)
        if not torch.is_grad_enabled():
            return x
        found: dict[str, torch.Tensor] = {}
        for term in self.terms:
            found.update(term(module, None, None))
        if not found:
            return x
        if self._recording:
            self._values.append({name: value.detach().float() for name, value in found.items()})
        return add_loss_gradient(x, sum(found.values()), self.loss_scale)

    def step_totals(self, group, device: torch.device) -> dict[str, torch.Tensor]:
        """Each term summed over this step's micro-batches and over the pipeline's stages (one all-reduce);
        the same dict on every rank of `group`. Clears the step's records."""
        local: dict[str, torch.Tensor] = {}
        for values in self._values:
            for name, value in values.items():
                local[name] = local.get(name, 0.0) + value
        self._values = []
        if self._names is None:  # stages without MoE layers have no terms: agree on the names once
            gathered: list = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, sorted(local), group=group)
            self._names = sorted({name for names in gathered for name in names})
        if not self._names:
            return {}
        stacked = torch.stack([torch.as_tensor(local.get(name, 0.0), dtype=torch.float32, device=device).reshape(())
                               for name in self._names])
        dist.all_reduce(stacked, group=group)
        return dict(zip(self._names, stacked))
