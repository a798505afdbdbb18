"""The loss curve of a run: <run dir>/loss_curve.png, train loss per logged step and validation loss per evaluation.

Written once, by the logging rank, when training ends (dsrecipes.training.trainer). The points come from the
run directory's metrics.jsonl when the run wrote one (it holds the steps before a restart or a resume into the
same directory too; a step logged twice keeps its last value), else from the values the run's MetricLoggers kept
in memory (logger=none or tensorboard only). Drawn by dsrecipes.utils.charts: without matplotlib no PNG, and one
log line saying how to get charts. A chart that cannot be written (a full disk) is a warning, not a failed run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from dsrecipes.utils.charts import write_line_chart
from dsrecipes.utils.logging import get_logger

LOSS_CURVE_FILE = "loss_curve.png"
METRICS_FILE = "metrics.jsonl"
SERIES = {"train/loss": "train loss", "val/loss": "validation loss"}


def read_loss_points(metrics_file: Path) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(step, value), ...]} for SERIES' metrics in a metrics.jsonl, by step; the last record of a step wins."""
    by_step: dict[str, dict[int, float]] = {key: {} for key in SERIES}
    with open(metrics_file) as lines:
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a killed run
                continue
            step = record.get("step")
            for key in SERIES:
                value = record.get(key)
                if isinstance(step, int) and isinstance(value, (int, float)) and math.isfinite(value):
                    by_step[key][step] = float(value)
    return {key: sorted(points.items()) for key, points in by_step.items()}


def write_loss_curve(run_dir: str | Path, history: Mapping[str, Sequence[tuple[int, float]]] | None = None) -> Path | None:
    """Draw <run dir>/loss_curve.png; returns its path, or None (no matplotlib, or no loss was logged)."""
    run_dir = Path(run_dir)
    metrics_file = run_dir / METRICS_FILE
    points = read_loss_points(metrics_file) if metrics_file.is_file() else {key: list((history or {}).get(key, []))
                                                                             for key in SERIES}
    series = {label: points.get(key, []) for key, label in SERIES.items()}
    try:
        return write_line_chart(run_dir / LOSS_CURVE_FILE, series, title=f"loss: {run_dir.name}", xlabel="step",
                                ylabel="loss (nats/token)")
    except (OSError, ValueError, RuntimeError) as error:  # a picture that cannot be drawn does not fail a trained run
        get_logger().warning("loss curve not written (%s: %s)", type(error).__name__, error)
        return None
