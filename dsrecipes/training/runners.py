"""Step runners: how one optimizer step's micro-batches go through the Engine, chosen when it is assembled.

* MicroBatchRunner: forward, extra loss terms, backward and engine.step per micro-batch (every
  layout but pipelines). Under Ulysses sequence parallelism it first cuts each micro-batch to this
  rank's chunk of every sequence (the batch slicing lives here, not in the loop).
* PipelineRunner: all micro-batches of the step through the pipeline schedule at once, then the
  optimizer step; the loss comes from the last stage. Under Ulysses it cuts the micro-batches to this
  rank's sequence chunk too, and passes the chunk's position offset to the stages.

Both give `Engine.train_batch` and `Engine.eval_loss` the same contract, so the Trainer's loop never
asks which layout it runs:

    totals = runner.train_batch(engine, next_batch, loss_terms)   # {"loss": sum over micro-batches, ...}
    val_loss = runner.eval_loss(engine, batches)                   # mean, the same on every rank
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

import torch
from torch import nn

from dsrecipes.distributed.pipeline_loss_terms import is_stage_local
from dsrecipes.distributed.pipeline_parallel import PipelineParallel
from dsrecipes.distributed.sequence_parallel import SequenceParallel, sequence_parallel_disabled
from dsrecipes.distributed.utils import mean_over_ranks
from dsrecipes.training.token_weights import IGNORE_INDEX, token_weights, with_a_label

# fn(model, batch, output) -> {name: scalar tensor}, added to the language-model loss (MoE aux loss, distillation)
LossTerm = Callable[[nn.Module, dict, object], dict]


class StepRunner:
    # objective(engine, batch) -> an output with .loss (and .metrics: {name: scalar}, logged as train/<name>) in place
    # of the language-model forward: DPO's (dsrecipes.training.preference.objective); None = the model's own loss
    objective = None

    def check_direct_use(self, call: str) -> None:
        """engine(...), engine.backward and engine.step are the per-micro-batch API; runners that own the
        whole step (pipelines) refuse them."""

    def train_batch(self, engine, next_batch: Callable[[], dict], loss_terms: Iterable[LossTerm] = ()) -> dict:
        raise NotImplementedError

    def eval_loss(self, engine, batches: Iterable[dict]) -> float:
        raise NotImplementedError

    def single_rank_module(self, engine):
        """Context yielding a module that runs whole sequences on this rank alone (text samples), or None."""
        return contextlib.nullcontext(engine.module)


class MicroBatchRunner(StepRunner):
    """token_weighted: the loss of a step is the mean over all label tokens of the global batch
    (data.loss_mean=global_tokens, dsrecipes.training.token_weights), not the mean of per-micro-batch means."""

    def __init__(self, sequence_parallel: SequenceParallel | None = None, token_weighted: bool = False):
        self.sequence_parallel = sequence_parallel
        self.token_weighted = token_weighted

    def prepare(self, batch: dict, device: torch.device) -> dict:
        """The micro-batch on the device and, under sequence parallelism, cut to this rank's chunk."""
        batch = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        return self.sequence_parallel.shard(batch) if self.sequence_parallel is not None else batch

    @staticmethod
    def forward(engine, batch: dict):
        extra = {key: batch[key] for key in ("position_offset", "position_ids") if key in batch}
        return engine(batch["input_ids"], labels=batch["labels"], **extra)

    def train_batch(self, engine, next_batch, loss_terms=()) -> dict[str, torch.Tensor]:
        totals: dict[str, torch.Tensor] = {}
        gas = engine.gradient_accumulation_steps
        if self.token_weighted:  # every micro-batch of the step first: the weights need the step's label count
            batches = [self.prepare(next_batch(), engine.device) for _ in range(gas)]
            weights = token_weights([b["labels"] for b in batches], gas, engine.device)
            batches = [with_a_label(b) if w == 0.0 else b for b, w in zip(batches, weights)]
        for index in range(gas):
            batch = batches[index] if self.token_weighted else self.prepare(next_batch(), engine.device)
            output = self.forward(engine, batch) if self.objective is None else self.objective(engine, batch)
            if self.token_weighted and weights[index] != 1.0:
                output.loss = output.loss * weights[index]
            loss, terms = output.loss, dict(getattr(output, "metrics", None) or {})
            if loss_terms:
                terms["lm_loss"] = output.loss
                for loss_term in loss_terms:
                    extra = loss_term(engine.module, batch, output)
                    terms.update(extra)
                    loss = loss + sum(extra.values())
            engine.backward(loss)
            engine.step()
            terms["loss"] = loss
            for name, value in terms.items():
                totals[name] = totals.get(name, 0.0) + value.detach().float()
        return totals

    def eval_loss(self, engine, batches) -> float:
        if self.objective is not None:
            return self._eval_objective(engine, batches)
        if self.token_weighted:
            return self._eval_token_mean(engine, batches)
        losses = [float(self.forward(engine, self.prepare(batch, engine.device)).loss) for batch in batches]
        loss = sum(losses) / max(1, len(losses))
        if self.sequence_parallel is not None:  # each rank scored its chunk: the mean is the full loss
            loss = float(mean_over_ranks(torch.tensor([loss], device=engine.device))[0])
        return loss

    def _eval_objective(self, engine, batches) -> float:
        """The objective's validation loss, each batch weighted by its rows (a last, smaller batch counts less)."""
        total, rows = 0.0, 0
        for batch in batches:
            batch = self.prepare(batch, engine.device)
            size = next(iter(batch.values())).shape[0]
            total += float(self.objective(engine, batch).loss) * size
            rows += size
        return total / max(1, rows)

    def _eval_token_mean(self, engine, batches) -> float:
        """The validation loss as the mean over all its label tokens (batches without one add nothing)."""
        total = torch.zeros(2, dtype=torch.float64, device=engine.device)  # sum of losses x labels, labels
        for batch in batches:
            batch = self.prepare(batch, engine.device)
            count = int((batch["labels"] != IGNORE_INDEX).sum())
            if count:
                total += torch.tensor([float(self.forward(engine, batch).loss) * count, count],
                                      dtype=torch.float64, device=engine.device)
        if self.sequence_parallel is not None:  # each rank scored its chunk of every sequence
            total = mean_over_ranks(total)
        return float(total[0] / total[1]) if float(total[1]) else float("nan")

    def single_rank_module(self, engine):
        if self.sequence_parallel is None:
            return contextlib.nullcontext(engine.module)
        return sequence_parallel_disabled(engine.module)


class PipelineRunner(StepRunner):
    """Micro-batches = gradient_accumulation_steps, as in DeepSpeed's PipelineEngine.train_batch."""

    def __init__(self, pipeline: PipelineParallel, sequence_parallel: SequenceParallel | None = None):
        self.pipeline = pipeline
        self.sequence_parallel = sequence_parallel  # Ulysses: every stage runs this rank's chunk of each sequence

    def _stacked(self, batches: list[dict], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The micro-batches' input_ids and labels concatenated (the schedule splits them again), cut to this
        rank's sequence chunk under sequence parallelism, and the chunk's position offset."""
        batch = {key: torch.cat([b[key] for b in batches]).to(device) for key in ("input_ids", "labels")}
        if self.sequence_parallel is not None:
            batch = self.sequence_parallel.shard(batch)
        return batch["input_ids"], batch["labels"], batch.get("position_offset", 0)

    def check_direct_use(self, call: str) -> None:
        raise ValueError(f"{call} is not available under pipeline parallelism (parallel.pp > 1): the schedule runs "
                         "every micro-batch of a step; use engine.train_batch(next_batch) and engine.eval_loss(batches)")

    def train_batch(self, engine, next_batch, loss_terms=()) -> dict[str, torch.Tensor]:
        stage_terms = self._stage_loss_terms(loss_terms)
        gas = engine.gradient_accumulation_steps
        input_ids, labels, offset = self._stacked([next_batch() for _ in range(gas)], engine.device)
        with engine.phases("forward_backward"), engine.forward_context():
            loss = self.pipeline.train_step(input_ids, labels, position_offset=offset,
                                                 loss_scale=engine.precision.loss_scale)
        engine.step_after_accumulation(gas)
        if stage_terms is None:
            return {"loss": loss * gas}
        terms = stage_terms.step_totals(self.pipeline.group, engine.device)
        lm_loss = loss * gas
        return {"lm_loss": lm_loss, **terms, "loss": lm_loss + sum(terms.values(), torch.zeros_like(lm_loss))}

    def _stage_loss_terms(self, loss_terms):
        """Loss terms evaluated inside each stage (MoE auxiliary losses); a term that needs the batch or the
        logits (distillation) cannot be, and is refused."""
        if not loss_terms:
            return None
        needs_output = [term for term in loss_terms if not is_stage_local(term)]
        if needs_output:
            raise ValueError("extra loss terms that read the batch or the logits (layer reduction's distillation) are "
                             "not supported under pipeline parallelism: the last stage computes the language-model "
                             "loss only (MoE auxiliary losses are added inside each stage)")
        return self.pipeline.set_loss_terms(list(loss_terms))

    def eval_loss(self, engine, batches) -> float:
        """Validation through the schedule, gradient_accumulation_steps micro-batches at a time (a last
        incomplete group is left out)."""
        gas, group, losses = engine.gradient_accumulation_steps, [], []
        for batch in batches:
            group.append(batch)
            if len(group) == gas:
                input_ids, labels, offset = self._stacked(group, engine.device)
                with engine.forward_context():
                    losses.append(self.pipeline.eval_loss(input_ids, labels, position_offset=offset))
                group = []
        loss = sum(losses) / max(1, len(losses))
        if self.sequence_parallel is not None:  # each sp rank scored its chunk: the mean is the full loss
            loss = float(mean_over_ranks(torch.tensor([loss], device=engine.device))[0])
        return loss

    def single_rank_module(self, engine):
        return contextlib.nullcontext(None)  # this rank holds only its stages
