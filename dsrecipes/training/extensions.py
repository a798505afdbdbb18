"""Extension points of the recipe Trainer, where later capabilities plug in without touching its loop.

* model_transforms: `fn(model) -> model`, applied after the model is built and before the engine
  wraps it (kernel injection, compression wrappers, MoE layers).
* loss_terms: `fn(model, batch, output) -> {name: scalar tensor}`, added to the language-model loss
  and logged as train/<name> (MoE auxiliary loss, distillation).
* batch_hooks: `fn(batch, step) -> batch`, applied to every micro-batch before the forward
  (curriculum truncation, token dropping schedules).
* callbacks: `Callback` objects told about train start/end, every optimizer step and every
  evaluation (pruning / quantization schedules, profilers). A callback with a `state_key` has its
  `state_dict()` saved in every checkpoint (client_state[state_key]) and restored on resume.
* batch_sources: `fn(trainer, batches) -> batches`, applied once to the Trainer's training batch
  iterator after it is built (a curriculum sampler replacing it). The result is what the Trainer
  draws from and checkpoints: it needs `__next__`, `state_dict` and `load_state_dict`.

A capability registers an `ExtensionBuilder` (`fn(cfg) -> Extensions`) with `register_extension`;
the Trainer calls every registered builder with the recipe and concatenates what they return.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn


class Callback:
    """Base class: override what you need. `trainer` is the running dsrecipes Trainer.

    Set `state_key` (and implement state_dict / load_state_dict) to be checkpointed with the run.
    """

    state_key: str | None = None

    def on_train_start(self, trainer: Any) -> None: ...

    def on_step_end(self, trainer: Any, step: int, metrics: dict) -> None: ...

    def on_eval_end(self, trainer: Any, step: int, metrics: dict) -> None: ...

    def on_train_end(self, trainer: Any, summary: dict) -> None: ...


@dataclass
class Extensions:
    model_transforms: list[Callable[[nn.Module], nn.Module]] = field(default_factory=list)
    loss_terms: list[Callable[..., dict]] = field(default_factory=list)
    batch_hooks: list[Callable[[dict, int], dict]] = field(default_factory=list)
    callbacks: list[Callback] = field(default_factory=list)
    batch_sources: list[Callable[[Any, Any], Any]] = field(default_factory=list)

    def extend(self, other: "Extensions") -> "Extensions":
        self.model_transforms += other.model_transforms
        self.loss_terms += other.loss_terms
        self.batch_hooks += other.batch_hooks
        self.callbacks += other.callbacks
        self.batch_sources += other.batch_sources
        return self


ExtensionBuilder = Callable[[Any], Extensions]
_BUILDERS: list[ExtensionBuilder] = []


def register_extension(builder: ExtensionBuilder) -> ExtensionBuilder:
    """Register a builder called with the recipe config for every Trainer (usable as a decorator)."""
    if builder not in _BUILDERS:
        _BUILDERS.append(builder)
    return builder


def build_extensions(cfg: Any) -> Extensions:
    """Everything the registered builders contribute for this recipe."""
    extensions = Extensions()
    for builder in _BUILDERS:
        extensions.extend(builder(cfg))
    return extensions
