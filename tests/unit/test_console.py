"""What dsrecipes prints off a terminal (stdout piped: SLURM, nohup, CI) is whole: dsrecipes.utils.console's
width and uncut tables, dsrecipes.utils.tables' Markdown copies, and a piped multirun summary that holds
every override in full, on the console and in <sweep dir>/summary.md and summary.csv."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from dsrecipes.utils.console import OFF_TERMINAL_WIDTH, make_console, print_table
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


def test_a_table_wider_than_the_console_is_printed_whole_off_a_terminal(no_columns):
    out = io.StringIO()
    console = make_console(file=out)
    table, overrides = _wide_table()
    print_table(console, table)
    lines = out.getvalue().splitlines()
    for i, override in enumerate(overrides):  # each row on one line, nothing cut or folded
        assert any(override in line and line.strip().startswith(f"│ {i}") for line in lines), override
    assert console.width == OFF_TERMINAL_WIDTH  # the console itself stays as it was
    console.print("x" * 250)
    assert max(len(line) for line in out.getvalue().splitlines()[-2:]) <= OFF_TERMINAL_WIDTH


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
