"""The NVMe offload benchmark's smoke mode: both offload rows measured, the disk's sequential bandwidth beside them."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from tests.helpers.environment import subprocess_env


@pytest.mark.slow
def test_nvme_offload_benchmark_smoke(tmp_path, datasets_cache):
    out, nvme = tmp_path / "out", tmp_path / "nvme"
    nvme.mkdir()
    env = subprocess_env(DSRECIPES_START_METHOD="fork")
    proc = subprocess.run([sys.executable, "-m", "dsrecipes.benchmarks.nvme_offload", "--smoke", "--out", str(out),
                           "--nvme-path", str(nvme), "--cache-dir", datasets_cache],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sequential" in proc.stdout and "% of seq" in proc.stdout
    rows = list(csv.DictReader((out / "nvme_offload.csv").open()))
    assert [(r["world_size"], r["offload"]) for r in rows] == [("1", "cpu"), ("1", "nvme")]
    cpu, nv = rows
    assert not cpu["error"] and not nv["error"], (cpu["error"], nv["error"], proc.stderr[-3000:])
    for row in rows:
        assert float(row["tokens_per_s"]) > 0 and float(row["peak_rss_mb"]) > 0
    assert float(nv["seq_read_gib_per_s"]) > 0 and float(nv["seq_write_gib_per_s"]) > 0
    assert float(nv["seq_mixed_gib_per_s"]) > 0 and float(nv["pct_of_sequential"]) > 0
    assert float(nv["read_gib"]) > 0 and float(nv["written_gib"]) > 0 and float(nv["io_gib_per_s"]) > 0
    assert float(nv["rss_vs_cpu"]) > 0 and float(nv["tokens_per_s_vs_cpu"]) > 0
    assert cpu["final_loss"] == nv["final_loss"]  # the same training, whatever holds the states
    assert not list(nvme.iterdir()), "the swap files and the scratch file are gone after the runs"
    for suffix in ("json", "md"):
        assert (out / f"nvme_offload.{suffix}").exists()
