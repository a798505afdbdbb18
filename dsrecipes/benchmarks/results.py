"""Writing benchmark rows, shared by every script here: one CSV and one JSON file per benchmark, and its table as Markdown."""

from __future__ import annotations

import json
from pathlib import Path

from dsrecipes.utils.tables import write_csv, write_table


def write_rows(out: Path, stem: str, rows: list[dict], table=None) -> Path:
    """<out>/<stem>.csv and <out>/<stem>.json, and <out>/<stem>.md when given the printed rich `table`; returns the CSV path."""
    csv_path = out / f"{stem}.csv"
    write_csv(csv_path, rows)
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=2))
    if table is not None:
        write_table(table, out / f"{stem}.md")
    return csv_path
