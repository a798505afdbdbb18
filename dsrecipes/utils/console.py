"""The rich Console everything in dsrecipes prints through, and printing tables on it uncut.

Off a terminal (stdout piped or redirected: SLURM, nohup, CI, `| tee`) rich falls back to 80
columns: log lines wrap at 80 and a table wider than that has its cells cut mid-word ("optimiz…").
`make_console` keeps the terminal's own width on a terminal and, off one, takes COLUMNS when it is
set, else OFF_TERMINAL_WIDTH. `print_table` goes further for tables, whose width is their content's:
off a terminal no column is wider than OFF_TERMINAL_CELL_WIDTH (a longer cell, such as the run summary's
layout line, wraps onto more lines instead of padding every other row of its column to its length), and
the table is printed at its natural width even past the console's, so nothing is cut; words longer than a
column fold rather than end in "…". On a terminal it is laid out to the terminal's width as rich does.

    console = make_console()
    print_table(console, table)
"""

from __future__ import annotations

import os
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.segment import Segments
from rich.table import Table

OFF_TERMINAL_WIDTH = 200  # wide enough for a log line or a summary table, narrow enough to read in a pager
OFF_TERMINAL_CELL_WIDTH = 100  # off a terminal a longer cell wraps: its column's other rows stay this narrow
_UNBOUNDED = 1_000_000  # the width a table is measured in, to find the width it wants


def make_console(**kwargs: Any) -> Console:
    """A rich Console (kwargs as rich's): the terminal's width on a terminal; off one COLUMNS, else OFF_TERMINAL_WIDTH.

    A `width` given explicitly is kept as is; COLUMNS is passed to rich as the width rather than left to its
    own reading of the environment.
    """
    columns = os.environ.get("COLUMNS", "")
    if "width" not in kwargs and columns.isdigit():
        kwargs["width"] = int(columns)
    console = Console(**kwargs)
    if "width" not in kwargs and not console.is_terminal:
        console.width = OFF_TERMINAL_WIDTH
    return console


def table_width(console: Console, table: Table) -> int:
    """The columns `table` takes when nothing limits it: its widest cells, and its title on one line."""
    width = console.measure(table, options=console.options.update_width(_UNBOUNDED)).maximum
    title = table.title if isinstance(table.title, str) else ""
    return max(width, cell_len(title))


def wrap_long_cells(table: Table, width: int = OFF_TERMINAL_CELL_WIDTH) -> None:
    """Cap every column of `table` at `width` cells (a column already capped narrower keeps its cap); text wraps at
    spaces and a longer word folds onto the next line, nothing is cut."""
    for column in table.columns:
        column.max_width = min(column.max_width or width, width)
        if not column.no_wrap:
            column.overflow = "fold"


def print_table(console: Console, table: Table) -> None:
    """Print `table` on `console`; off a terminal with its long cells wrapped (wrap_long_cells), at its full width
    even past the console's, so no cell is cut."""
    if console.is_terminal:
        console.print(table)
        return
    wrap_long_cells(table)
    width = table_width(console, table)
    if width <= console.width:
        console.print(table)
        return
    lines = console.render(table, console.options.update_width(width))
    console.print(Segments(lines), crop=False)  # crop=False: the console would cut the lines at its own width
