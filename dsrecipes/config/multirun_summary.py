"""Hydra callback that prints one table for a multirun sweep: each job's overrides and final metrics.

Jobs write <job dir>/summary.json when they finish; reading those files (rather than in-process
return values) keeps the table right under launchers that run jobs elsewhere (e.g. submitit).
The table is also written to <sweep dir>/summary.md and its rows, with every override, to
<sweep dir>/summary.csv. With `optimized_metric` set (the value an optimising sweeper such as Optuna
minimises or maximises) that metric is a column too, first after the overrides. A sweep in which no job
wrote a summary (every job failed, or mode=generate jobs, which have no metrics) prints and writes nothing.
Off a terminal (SLURM logs, CI, `| tee`) the table is printed at its full width, never cut to 80 columns
(dsrecipes.utils.console).
"""

from __future__ import annotations

import json
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

SUMMARY_FILE = "summary.json"
TABLE_FILE = "summary.md"
ROWS_FILE = "summary.csv"
_COLUMNS = ("val/loss", "val/ppl", "train/loss", "perf/tokens_per_s", "time/total_s")


def _format(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def summary_columns(optimized_metric: str | None = None) -> tuple[str, ...]:
    """The metric columns: the optimized metric first (when set), then the usual ones."""
    if not optimized_metric:
        return _COLUMNS
    return (optimized_metric, *(c for c in _COLUMNS if c != optimized_metric))


def summary_rows(sweep_dir: Path, columns: tuple[str, ...] = _COLUMNS) -> list[dict]:
    """One row per job that wrote summary.json, in job order: job, overrides (those that differ), every override, metrics."""
    jobs = sorted(sweep_dir.glob(f"*/{SUMMARY_FILE}"), key=lambda p: (len(p.parent.name), p.parent.name))
    summaries = [json.loads(path.read_text()) for path in jobs]
    shared = set.intersection(*(set(s.get("overrides", [])) for s in summaries)) if summaries else set()
    rows = []
    for path, summary in zip(jobs, summaries):
        overrides = summary.get("overrides", [])
        metrics = summary.get("metrics", {})
        rows.append({"job": path.parent.name, "overrides": " ".join(o for o in overrides if o not in shared),
                     "all_overrides": " ".join(overrides), **{c: metrics.get(c) for c in columns}})
    return rows


def summary_table(sweep_dir: Path, rows: list[dict], columns: tuple[str, ...] = _COLUMNS, optimized_metric: str | None = None):
    from rich.table import Table

    table = Table(title=f"multirun summary: {sweep_dir}")
    table.add_column("job")
    table.add_column("overrides (those that differ)", overflow="fold")  # folded, never cut, on a narrow terminal
    for column in columns:
        header = f"{column} (optimized)" if column == optimized_metric else column
        table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(row["job"], row["overrides"], *("-" if row[c] is None else _format(row[c]) for c in columns))
    return table


class MultirunSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from dsrecipes.utils.console import make_console, print_table
        from dsrecipes.utils.tables import write_csv, write_table

        sweep_dir = Path(config.hydra.sweep.dir)
        optimized_metric = config.get("optimized_metric")
        columns = summary_columns(optimized_metric)
        rows = summary_rows(sweep_dir, columns)
        if not rows:
            return
        table = summary_table(sweep_dir, rows, columns, optimized_metric)
        print_table(make_console(), table)
        write_table(table, sweep_dir / TABLE_FILE)
        write_csv(sweep_dir / ROWS_FILE, rows)
