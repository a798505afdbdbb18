"""PNG charts beside the tables dsrecipes writes: loss curves of a run, benchmark and autotuning results.

matplotlib is an optional extra (`pip install "dsrecipes[charts]"`). Without it every function here
returns None and logs, once per process, one line saying how to get charts; nothing else changes.
The Agg backend is used, so charts are drawn on machines without a display (CI, cluster nodes).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from dsrecipes.utils.logging import get_logger

CHARTS_HINT = 'charts need matplotlib: pip install "dsrecipes[charts]"'
_hinted = False


def charts_available() -> bool:
    """True when matplotlib can be imported here."""
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or None (with the one-line hint, once) when matplotlib is absent."""
    global _hinted
    if not charts_available():
        if not _hinted:
            get_logger().info(CHARTS_HINT)
            _hinted = True
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _finite(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in points if y is not None and math.isfinite(float(y))]


def write_line_chart(
    path: str | Path,
    series: Mapping[str, Sequence[tuple[float, float]]],
    title: str,
    xlabel: str,
    ylabel: str,
    log_y: bool = False,
) -> Path | None:
    """One line per named series of (x, y) points (non-finite y left out); returns the PNG's path, or None
    without matplotlib or when no series has a point."""
    plt = _pyplot()
    cleaned = {name: _finite(points) for name, points in series.items()}
    cleaned = {name: points for name, points in cleaned.items() if points}
    if plt is None or not cleaned:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    try:
        for name, points in cleaned.items():
            xs, ys = zip(*points)
            ax.plot(xs, ys, label=name, marker="o" if len(points) <= 20 else None, markersize=3)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if log_y:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def write_bar_chart(
    path: str | Path,
    labels: Sequence[str],
    values: Sequence[float | None],
    title: str,
    ylabel: str,
    highlight: int | None = None,
) -> Path | None:
    """Horizontal bars, one per label (a None value drawn as an empty bar); `highlight` marks one bar
    (e.g. the best candidate). Returns the PNG's path, or None without matplotlib or without labels."""
    plt = _pyplot()
    if plt is None or not labels:
        return None
    heights = [0.0 if v is None or not math.isfinite(float(v)) else float(v) for v in values]
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.4 * len(labels) + 1.2)), dpi=110)
    try:
        colors = ["tab:orange" if i == highlight else "tab:blue" for i in range(len(labels))]
        ax.barh(range(len(labels)), heights, color=colors)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()  # first label on top, as in the table
        ax.set_xlabel(ylabel)
        ax.set_title(title)
        ax.grid(True, axis="x", alpha=0.3)
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
