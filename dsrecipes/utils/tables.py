"""A rich Table as a Markdown file, and rows as CSV: the tables dsrecipes prints are also written beside a
run's results.

The console copy of a table can be cut or wrapped by the terminal and is lost with the scrollback;
the Markdown copy (`<run dir>/serve_bench.md`, `<sweep dir>/summary.md`, `<out>/<benchmark>.md`)
holds every cell whole, reads as text, and renders as a table on GitHub and in most editors.
"""

from __future__ import annotations

import csv
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

_ALIGN = {"right": "---:", "center": ":---:"}


def _plain(cell) -> str:
    """A cell's text without rich markup or styles, one line, with Markdown's table separator escaped."""
    if isinstance(cell, Text):
        text = cell.plain
    elif isinstance(cell, str):
        text = Text.from_markup(cell).plain
    else:  # another renderable: its text as rich would print it
        console = Console(width=10_000, color_system=None)
        with console.capture() as capture:
            console.print(cell, end="")
        text = capture.get()
    return " ".join(text.split()).replace("|", "\\|")


def table_markdown(table: Table) -> str:
    """`table` as Markdown: its title as a heading, then a header row (when the table shows one) and every row."""
    lines = []
    if table.title:
        lines += [f"## {_plain(table.title)}", ""]
    columns = table.columns
    header = [_plain(c.header) for c in columns] if table.show_header else [""] * len(columns)
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(_ALIGN.get(c.justify, "---") for c in columns) + "|")
    rows = zip(*(list(c.cells) for c in columns)) if columns else []
    lines += ["| " + " | ".join(_plain(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_table(table: Table, path: str | Path) -> Path:
    """Write `table` to `path` as Markdown (table_markdown); returns the path."""
    path = Path(path)
    path.write_text(table_markdown(table))
    return path


def write_csv(path: str | Path, rows: list[dict], fields: list[str] | None = None) -> None:
    """Rows as CSV with a header (columns: `fields`, default the first row's keys)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields or list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
