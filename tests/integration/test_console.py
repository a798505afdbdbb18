"""What dsrecipes prints off a terminal (stdout piped: SLURM, nohup, CI) is whole: dsrecipes.utils.console's
width and uncut tables, dsrecipes.utils.tables' Markdown copies, and a piped multirun summary that holds
every override in full, on the console and in <sweep dir>/summary.md and summary.csv."""

from __future__ import annotations

import csv

import pytest

from tests.helpers.cli import run_cli
from tests.unit.test_console import no_columns  # noqa: F401 - fixtures, used by name


def override_cells(stdout: str) -> dict[str, str]:
    """The summary table's overrides column per job, a folded cell's lines joined back."""
    cells: dict[str, str] = {}
    job = None
    for line in stdout.splitlines():
        parts = line.split("│")
        if len(parts) < 4:  # a rule or the title: a row's cell lines are over
            job = None
            continue
        first, second = parts[1].strip(), parts[2].strip()
        if first.isdigit():
            job = first
            cells[job] = second
        elif job is not None and not first:
            cells[job] += second
    return cells


@pytest.mark.slow
def test_piped_multirun_summary_holds_every_override_in_full(tmp_path, fast_overrides, no_columns):
    """Two tiny jobs whose differing overrides are far wider than 80 (or 200) columns, stdout piped."""
    dirnames = [f"checkpoints_of_job_{i}_" + "d" * 150 for i in range(2)]
    ours = {"trainer.max_steps": "2", "trainer.eval_interval": "0", "trainer.sample_tokens": "0", "trainer.log_interval": "1",
            "checkpoint.save_final": "false", "logger": "none"}
    args = ["-m", f"checkpoint.dirname={','.join(dirnames)}", *(f"{k}={v}" for k, v in ours.items())]
    result = run_cli(args + [o for o in fast_overrides if o.split("=")[0] not in ours], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    overrides = [f"checkpoint.dirname={d}" for d in dirnames]
    cells = override_cells(result.stdout)  # folded at 100 cells off a terminal (never cut, never padded)
    assert cells == {str(job): override for job, override in enumerate(overrides)}, result.stdout[-3000:]
    (sweep,) = (tmp_path / "outputs" / "multirun").glob("*/*")
    markdown = (sweep / "summary.md").read_text()
    assert all(f"| {job} | {override} |" in markdown for job, override in enumerate(overrides)), markdown
    with open(sweep / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1"] and [r["overrides"] for r in rows] == overrides
    assert all("trainer.max_steps=2" in r["all_overrides"] and float(r["train/loss"]) > 0 for r in rows)
