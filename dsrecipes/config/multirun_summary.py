"""Hydra callback that prints one table for a multirun sweep: each job's overrides and final metrics.

Jobs write <job dir>/summary.json when they finish; reading those files (rather than in-process
return values) keeps the table right under launchers that run jobs elsewhere (e.g. submitit).
"""

from __future__ import annotations

import json
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

SUMMARY_FILE = "summary.json"
_COLUMNS = ("val/loss", "val/ppl", "train/loss", "perf/tokens_per_s", "time/total_s")


def _format(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class MultirunSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from rich.console import Console
        from rich.table import Table

        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = sorted(
            (p for p in sweep_dir.glob(f"*/{SUMMARY_FILE}")), key=lambda p: (len(p.parent.name), p.parent.name)
        )
        table = Table(title=f"multirun summary: {sweep_dir}")
        table.add_column("job")
        table.add_column("overrides (those that differ)")
        for column in _COLUMNS:
            table.add_column(column, justify="right")
        summaries = [json.loads(path.read_text()) for path in jobs]
        shared = set.intersection(*(set(s.get("overrides", [])) for s in summaries)) if summaries else set()
        for path, summary in zip(jobs, summaries):
            metrics = summary.get("metrics", {})
            table.add_row(
                path.parent.name,
                " ".join(o for o in summary.get("overrides", []) if o not in shared),
                *(_format(metrics.get(c, "-")) for c in _COLUMNS),
            )
        Console().print(table)
