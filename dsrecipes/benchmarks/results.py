"""Writing benchmark rows, shared by every script here: one CSV and one JSON file per benchmark, its table as
Markdown, and a bar chart of its main figure per configuration as PNG (<out>/<stem>.png).

The chart needs matplotlib (the `charts` extra); without it dsrecipes.utils.charts logs one line saying how to
get charts and the CSV, JSON and Markdown are written as before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dsrecipes.utils.charts import write_bar_chart
from dsrecipes.utils.tables import write_csv, write_table


@dataclass(frozen=True)
class BarChart:
    """Which figure of a benchmark's rows the PNG shows: one bar per row and value key.

    values: {row key: name in the bar's label} (several keys: one bar each, e.g. every framework's tokens/s);
    labels: the row keys naming a configuration ("stage=2"); better: "max" or "min" (the best bar is highlighted).
    """

    title: str
    axis: str  # the figure and its unit, e.g. "tokens/s"
    values: Mapping[str, str]
    labels: Sequence[str] = field(default_factory=tuple)
    better: str | None = "max"


def _bar_label(row: dict, labels: Sequence[str], value_name: str) -> str:
    parts = [f"{key}={row.get(key)}" for key in labels]
    if value_name:
        parts.append(value_name)
    return " ".join(parts) or "-"


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def chart_bars(rows: Sequence[dict], chart: BarChart) -> tuple[list[str], list[float | None], int | None]:
    """(labels, values, index of the best bar or None) of `chart` over `rows`; a missing value is None."""
    labels, values = [], []
    for row in rows:
        for key, name in chart.values.items():
            labels.append(_bar_label(row, chart.labels, name))
            values.append(_number(row.get(key)))
    measured = [(v, i) for i, v in enumerate(values) if v is not None]
    best = None
    if measured and chart.better in ("max", "min"):
        best = (max(measured) if chart.better == "max" else min(measured))[1]
    return labels, values, best


def write_chart(out: Path, stem: str, rows: Sequence[dict], chart: BarChart) -> Path | None:
    """<out>/<stem>.png, the bar chart of `chart` over `rows`; None without matplotlib or rows."""
    labels, values, best = chart_bars(rows, chart)
    suffix = {"max": " (higher is better)", "min": " (lower is better)"}.get(chart.better or "", "")
    return write_bar_chart(out / f"{stem}.png", labels, values, chart.title, chart.axis + suffix, highlight=best)


def write_rows(out: Path, stem: str, rows: list[dict], table=None, chart: BarChart | None = None) -> Path:
    """<out>/<stem>.csv and <out>/<stem>.json, <out>/<stem>.md when given the printed rich `table`, and <out>/<stem>.png
    when given a `chart` (and matplotlib is installed); returns the CSV path."""
    csv_path = out / f"{stem}.csv"
    write_csv(csv_path, rows)
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=2))
    if table is not None:
        write_table(table, out / f"{stem}.md")
    if chart is not None:
        write_chart(out, stem, rows, chart)
    return csv_path
