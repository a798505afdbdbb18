"""Rows of the compatibility matrix, declared by the config group they concern.

A group schema lists, as the class attribute `COMPATIBILITY`, how it composes with the parallel layouts and the
other groups: a `Refusal` per combination dsrecipes does not run (its message names the keys and values), a
`Supported` row per combination it does, naming what shows it (rows of the suite's layout-equivalence table,
tests/integration/equivalence/table.py, or a test's path::name). dsrecipes.config.compatibility gathers them
from the recipe's groups into one matrix: the check before any work starts and the table of the docs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """A combination dsrecipes does not run: `message(root, dims)` is the error, None when the recipe is clear."""

    combination: str  # the matrix's row (docs/model-parallelism.md)
    reason: str  # why, for the docs
    message: Callable  # (root: RootConfig, dims: ParallelDims) -> str | None


@dataclass(frozen=True)
class Supported:
    combination: str
    status: str  # what runs
    tests: tuple[str, ...]  # what shows it: layout-equivalence table rows, or tests' path::name
