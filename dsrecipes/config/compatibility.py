"""The compatibility matrix: which combinations of config groups run, which are refused, and why.

Each group declares its own rows beside its fields (a `COMPATIBILITY` tuple of Refusal / Supported rows on its
schema, dsrecipes.utils.compatibility_rows); this module gathers them in RootConfig's order into one matrix.
`check_compatibility` (called by validate_recipe before any worker starts) raises the first refusal a recipe
hits, as a ValueError naming the keys and their values; the compatibility matrix in docs/model-parallelism.md is
`matrix_markdown()` (tests/unit/test_compatibility.py holds the two together). Per-group value checks (a degree
that does not divide the heads, a schedule name that does not exist) stay with each group's `check`; the matrix
is about groups that do not go together.

A row that becomes supported moves from a Refusal to a Supported row of its group, naming what shows it: a row of
the suite's layout-equivalence table (tests/integration/equivalence/table.py), where a new layout is added as a row.
"""

from __future__ import annotations

import dataclasses
import typing

from dsrecipes.config.schema import RootConfig
from dsrecipes.utils.compatibility_rows import Refusal, Supported


def _group_rows() -> list:
    """Every group schema's COMPATIBILITY rows, in RootConfig's field order."""
    hints = typing.get_type_hints(RootConfig)
    rows: list = []
    for f in dataclasses.fields(RootConfig):
        rows += getattr(hints[f.name], "COMPATIBILITY", ())
    return rows


_ROWS = _group_rows()
REFUSED: tuple[Refusal, ...] = tuple(row for row in _ROWS if isinstance(row, Refusal))
# Each supported row names what shows it: rows of the suite's layout-equivalence table (tests/integration/equivalence/
# table.py, each one run through the CLI against one process), or a test's path::name. tests/unit/
# test_compatibility.py fails when a row names none, or names a row or test that does not exist.
SUPPORTED: tuple[Supported, ...] = tuple(row for row in _ROWS if isinstance(row, Supported))


def check_compatibility(root, dims) -> None:
    """Raise the first REFUSED combination `root` (a RootConfig at layout `dims`) hits, naming its keys."""
    for refusal in REFUSED:
        message = refusal.message(root, dims)
        if message is not None:
            raise ValueError(message)


def _shown_by(test: str) -> str:
    """A table row as `row`, a test by its function name."""
    return f"`{test.rsplit('::', 1)[-1]}`" if "::" in test else f"`{test}`"


def matrix_markdown() -> str:
    """The compatibility matrix of docs/model-parallelism.md, generated from SUPPORTED and REFUSED."""
    rows = ["| combination | status | shown by |", "|---|---|---|"]
    rows += [f"| {s.combination} | {s.status} | {', '.join(_shown_by(t) for t in s.tests)} |" for s in SUPPORTED]
    rows += [f"| {r.combination} | refused: {r.reason} | |" for r in REFUSED]
    return "\n".join(rows)
