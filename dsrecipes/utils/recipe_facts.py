"""What a config group's own checks may ask besides its keys: the whole recipe and the facts of the run.

Each group schema that has cross-key checks defines `check(self, facts: RecipeFacts)`, raising ValueError
naming the key, its value and what would be valid; dsrecipes.config.validate walks the recipe's groups in
RootConfig's order and calls each (those marked `CHECKED_BY_ENGINE = True` last, in validate_engine_config,
which dsrecipes.initialize also runs on its own). The layout (`facts.dims`) is built the first time a check asks for it, so
a recipe whose parallel degrees do not fit the world size fails there, naming parallel.* / zero.* keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cached_property
from typing import Any


@dataclasses.dataclass
class RecipeFacts:
    """root: the typed recipe (a RootConfig); world: its number of processes; node_size: processes per node;
    device: the torch.device it trains on; lr_scheduler_target(): the schedule's `_target_` when it is not one
    of dsrecipes' closed-form schedules (None when it is); layout: builds the ParallelDims; batching: resolves the
    batch triple (BatchSizes) over the layout's data-parallel size."""

    root: Any
    world: int
    node_size: int
    device: Any
    lr_scheduler_target: Callable[[], str | None]
    layout: Callable[[], Any]
    batching: Callable[[Any], Any]

    @cached_property
    def dims(self) -> Any:
        """The run's ParallelDims (built once, on first use)."""
        return self.layout()

    @cached_property
    def batch(self) -> Any:
        """The run's BatchSizes: micro-batch, gradient accumulation steps and global batch per optimizer step."""
        return self.batching(self.dims)


def check_groups(root: Any, facts: RecipeFacts, engine: bool) -> None:
    """Every group's own `check(facts)`, in the recipe's field order: the groups whose schema says
    CHECKED_BY_ENGINE = True (what the Engine consumes, checked by dsrecipes.initialize as well) when `engine`,
    the others otherwise."""
    for f in dataclasses.fields(root):
        section = getattr(root, f.name)
        check = getattr(section, "check", None)
        if callable(check) and getattr(type(section), "CHECKED_BY_ENGINE", False) == engine:
            check(facts)
