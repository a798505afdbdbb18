"""Extension points of the recipe Trainer, where capabilities plug in without touching its loop.

* model_transforms: `fn(model) -> model`, applied by `parallelize` (step 4) to the whole model, after
  kernel injection and activation checkpointing, before any sharding (compression wrappers,
  random-LTD).
* loss_terms: `fn(model, batch, output) -> {name: scalar tensor}`, added to the language-model loss
  and logged as train/<name> (MoE auxiliary loss, distillation).
* batch_hooks: `fn(batch, step) -> batch`, applied to every micro-batch before the forward
  (curriculum truncation, token dropping schedules).
* callbacks: `Callback` objects told about train start/end, every optimizer step and every
  evaluation (pruning / quantization schedules, profilers), and closed on every exit path. Every
  callback's `state_dict()` is saved in every checkpoint (client_state["callbacks"][state_key]) and restored on resume.
* token_counter: `fn(batch) -> tokens` (at most one): how many tokens a micro-batch (after the batch
  hooks) counts as processed in perf/tokens_per_s; default its input_ids' size (random-LTD counts
  the tokens its layers kept, averaged over the layers).
* batch_sources: `fn(context, batches) -> batches`, applied once to the Trainer's training batch
  iterator after it is built (a curriculum sampler replacing it). The result is what the Trainer
  draws from and checkpoints: it needs `__next__`, `state_dict` and `load_state_dict`.

Callbacks and batch sources see a `RunContext` (the recipe, the run directory, rank and device, the
batch arithmetic, the data and, once built, the engine and the loggers), not the Trainer. The recipe's
own extensions are one ordered list, dsrecipes.training.extensions.recipe.RECIPE_EXTENSIONS; a user
passes more with `Trainer(..., extensions=...)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn


@dataclass
class RunContext:
    """What extensions may use of a running recipe."""

    cfg: Any  # the RootConfig
    run_dir: Path
    rank: int
    device: torch.device
    batch: Any  # BatchSizes
    data: Any = None  # PreparedData: train / validation splits and the tokenizer
    data_rank: int = 0  # which data shard this rank reads (model-parallel peers share one)
    engine: Any = None  # the Engine, once built
    loggers: Any = None  # MetricLoggers, once built

    @property
    def is_logging_rank(self) -> bool:
        return self.rank == 0

    def is_log_step(self, step: int) -> bool:
        t = self.cfg.trainer
        return step % t.log_interval == 0 or step == t.max_steps


class Callback:
    """Base class: override what you need. `context` is the run's RunContext.

    state_dict / load_state_dict: what this callback must carry across a resume (default: nothing);
    state_key: its name in the checkpoint (default: the class name).
    """

    state_key: str | None = None

    def on_train_start(self, context: RunContext) -> None: ...

    def on_step_end(self, context: RunContext, step: int, metrics: dict) -> None: ...

    def on_eval_end(self, context: RunContext, step: int, metrics: dict) -> None: ...

    def on_train_end(self, context: RunContext, summary: dict) -> None: ...

    def close(self) -> None:
        """Called once on every exit path of Trainer.fit (errors included), after on_train_end: release
        what on_train_start took (e.g. functions it wrapped); must be safe to call when it never started."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None: ...


def _state_keys(callbacks: list[Callback]) -> list[str]:
    """Each callback's checkpoint key, made unique in list order (a second X becomes X.1)."""
    keys: list[str] = []
    for callback in callbacks:
        key = callback.state_key or type(callback).__name__
        unique, n = key, 0
        while unique in keys:
            n += 1
            unique = f"{key}.{n}"
        keys.append(unique)
    return keys


def callback_states(callbacks: list[Callback]) -> dict[str, dict]:
    """{key: state_dict()} of every callback (what a checkpoint stores)."""
    return {key: callback.state_dict() for key, callback in zip(_state_keys(callbacks), callbacks)}


def load_callback_states(callbacks: list[Callback], states: dict[str, dict]) -> None:
    """Restore what callback_states saved (callbacks without a stored state are left as they are)."""
    for key, callback in zip(_state_keys(callbacks), callbacks):
        if key in states:
            callback.load_state_dict(states[key])


@dataclass
class Extensions:
    model_transforms: list[Callable[[nn.Module], nn.Module]] = field(default_factory=list)
    loss_terms: list[Callable[..., dict]] = field(default_factory=list)
    batch_hooks: list[Callable[[dict, int], dict]] = field(default_factory=list)
    callbacks: list[Callback] = field(default_factory=list)
    batch_sources: list[Callable[[RunContext, Any], Any]] = field(default_factory=list)
    token_counter: Callable[[dict], float] | None = None

    def extend(self, other: Extensions) -> Extensions:
        self.model_transforms += other.model_transforms
        self.loss_terms += other.loss_terms
        self.batch_hooks += other.batch_hooks
        self.callbacks += other.callbacks
        self.batch_sources += other.batch_sources
        if other.token_counter is not None:
            if self.token_counter is not None:
                raise ValueError("two extensions count processed tokens (Extensions.token_counter); keep one")
            self.token_counter = other.token_counter
        return self


ExtensionBuilder = Callable[[Any], Extensions]
