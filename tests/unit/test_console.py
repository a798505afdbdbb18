"""What dsrecipes prints off a terminal (stdout piped: SLURM, nohup, CI) is whole: dsrecipes.utils.console's
width and uncut tables, dsrecipes.utils.tables' Markdown copies, and a piped multirun summary that holds
every override in full, on the console and in <sweep dir>/summary.md and summary.csv."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from dsrecipes.utils.console import OFF_TERMINAL_CELL_WIDTH, OFF_TERMINAL_WIDTH, make_console, print_table
from dsrecipes.utils.tables import table_markdown


@pytest.fixture
def no_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)


def test_off_a_terminal_the_console_is_wide(no_columns):
    assert Console(file=io.StringIO()).width == 80  # rich's own fallback, which cut tables mid-word
    assert make_console(file=io.StringIO()).width == OFF_TERMINAL_WIDTH


def test_columns_and_an_explicit_width_are_kept(monkeypatch):
    monkeypatch.setenv("COLUMNS", "123")
    assert make_console(file=io.StringIO()).width == 123
    assert make_console(file=io.StringIO(), width=90).width == 90


def test_on_a_terminal_the_terminal_decides(no_columns):
    ours = make_console(file=io.StringIO(), force_terminal=True)
    assert ours.is_terminal and ours.width == Console(file=io.StringIO(), force_terminal=True).width


def _wide_table() -> tuple[Table, list[str]]:
    overrides = [f"checkpoint.dirname=job_{i}_" + "x" * 300 for i in range(2)]
    table = Table(title="multirun summary")
    table.add_column("job")
    table.add_column("overrides", overflow="fold")
    table.add_column("val/loss", justify="right")
    for i, override in enumerate(overrides):
        table.add_row(str(i), override, "1.25")
    return table, overrides


def test_off_a_terminal_long_cells_wrap_and_nothing_is_cut(no_columns):
    """Issue 40: a 300-character cell wraps in its column (OFF_TERMINAL_CELL_WIDTH) instead of widening the whole
    table to its length; read column-wise, every cell is still whole."""
    out = io.StringIO()
    console = make_console(file=out)
    table, overrides = _wide_table()
    print_table(console, table)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= OFF_TERMINAL_CELL_WIDTH + 30 and "…" not in out.getvalue()
    column = "".join(line.split("│")[2].strip() for line in lines if line.count("│") == 4)
    for override in overrides:
        assert override in column, override
    assert console.width == OFF_TERMINAL_WIDTH  # the console itself stays as it was
    console.print("x" * 250)
    assert max(len(line) for line in out.getvalue().splitlines()[-2:]) <= OFF_TERMINAL_WIDTH


def test_off_a_terminal_one_long_row_does_not_pad_the_others(no_columns):
    """The run summary's shape: short numbers and one long layout line in the value column."""
    out = io.StringIO()
    console = make_console(file=out)
    table = Table(show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("parameters", "1,865,856")
    layout = " | ".join(f"part {i}: some words of the layout line" for i in range(8))
    table.add_row("layout", layout)
    print_table(console, table)
    lines = out.getvalue().splitlines()
    number_line = next(line for line in lines if "1,865,856" in line)
    assert len(number_line) <= OFF_TERMINAL_CELL_WIDTH + 20 < len(layout)
    assert " ".join(" ".join(line.split("│")[2].split()) for line in lines if line.count("│") == 3 and
                    ("part" in line or "words" in line or "layout" in line.split("│")[2])).find("part 7") >= 0


def test_on_a_terminal_a_wide_table_is_folded_to_its_width_not_cut(no_columns):
    out = io.StringIO()
    console = make_console(file=out, force_terminal=True, width=100, color_system=None)
    table, overrides = _wide_table()
    print_table(console, table)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 100 and "…" not in text
    assert "x" * 300 in "".join(line.split("│")[2].strip() for line in text.splitlines() if line.count("│") == 4)


def test_table_markdown_holds_every_cell_whole():
    table, overrides = _wide_table()
    table.add_row("2", "a|b [bold]c[/bold]", "-")
    lines = table_markdown(table).splitlines()
    assert lines[0] == "## multirun summary" and lines[1] == ""
    assert lines[2] == "| job | overrides | val/loss |" and lines[3] == "|---|---|---:|"
    assert lines[4:] == [f"| 0 | {overrides[0]} | 1.25 |", f"| 1 | {overrides[1]} | 1.25 |", "| 2 | a\\|b c | - |"]
