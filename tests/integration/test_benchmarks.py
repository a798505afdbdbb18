"""Smoke test of the distributed throughput benchmark: dsrecipes and the hand-written loop, world size 2."""

from __future__ import annotations

import csv

import pytest

from dsrecipes.benchmarks import distributed_throughput


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_distributed_throughput_smoke(tmp_path, datasets_cache):
    rows = distributed_throughput.main([
        "--world-size", "2", "--stage", "1", "--frameworks", "dsrecipes", "handwritten",
        "--model", "gpt_debug", "--seq", "64", "--micro-batch", "4", "--steps", "4", "--log-interval", "2",
        "--max-bytes", "300000", "--cache-dir", datasets_cache, "--out", str(tmp_path), "--timeout", "240",
    ])
    assert len(rows) == 1
    with open(tmp_path / "distributed_throughput.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert row["stage"] == "1"
    for kind in ("dsrecipes", "handwritten"):
        assert not row[f"{kind}_error"], row[f"{kind}_error"]
        assert float(row[f"{kind}_tokens_per_s"]) > 0
        assert float(row[f"{kind}_peak_mb"]) > 0
    assert float(row["vs_handwritten"]) > 0
    # Same model, data order and optimizer: both train to (nearly) the same loss.
    assert float(row["dsrecipes_final_loss"]) == pytest.approx(float(row["handwritten_final_loss"]), rel=1e-2)
    assert (tmp_path / "distributed_throughput.json").exists()
    assert "| 1 | " in (tmp_path / "distributed_throughput.md").read_text()  # the printed table, stage 1's row
