"""dsrecipes.benchmarks.gpu_suite: the --smoke run on CPU (in-process) writes both tables with every section,
and the target logic applied to GPU-like rows (no GPU needed). The GPU measurements themselves are not tested."""

from __future__ import annotations

import csv

import pytest
import torch

from dsrecipes.benchmarks import gpu_suite as gs
from dsrecipes.benchmarks import gpu_suite_report as rep
from dsrecipes.models.kernel_policy import INJECTABLE_OPS, POLICY_FILE, load_policy


@pytest.mark.slow
@pytest.mark.timeout(480)  # ~35-60 s alone; over 180 s beside the rest of the suite on 2 cores
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke: on a GPU the suite measures for real")
def test_smoke_on_cpu_writes_both_tables_with_every_section(tmp_path, datasets_cache, capsys):
    before = POLICY_FILE.read_bytes()
    gs.main(["--smoke", "--out", str(tmp_path), "--write-policy", "--train-extra", f"data.cache_dir={datasets_cache}"])
    printed = capsys.readouterr().out
    assert POLICY_FILE.read_bytes() == before  # a smoke never installs its (unmeasured) policy
    assert "--write-policy: not installed" in printed

    with open(tmp_path / "gpu_suite.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(rep.FIELDS)
    assert {r["section"] for r in rows} == {"kernels", "train", "inference", "tests", "suite"}
    names = {r["name"]: r for r in rows}
    for op in gs.SMOKE_KERNEL_OPS:
        assert any(n.startswith(f"{op} fwd [") for n in names), op
    flash = names["target: flash_attention fwd x SDPA (T=4096, D=128)"]
    assert flash["target"] == ">= 0.9" and flash["met"] == "n/a (smoke)" and float(flash["value"]) > 0
    assert names["target: layer_norm fwd fraction of HBM bandwidth"]["target"] == ">= 0.8"

    assert float(names["precision=fp32: tokens/s"]["value"]) > 0  # the eager variant, fp32 on CPU
    assert float(names["precision=fp32 kernels=auto: tokens/s"]["value"]) > 0
    assert "skipped: not run on CPU" in names["precision=bf16 compile=blocks: tokens/s"]["note"]
    assert names["target: precision=bf16 compile=blocks: MFU"]["target"] == ">= 0.5"

    assert float(names["engine batch 1: decode"]["value"]) > 0 and float(names["int8 batch 1: decode"]["value"]) > 0
    assert names["target: engine batch 1: fraction of bandwidth roofline"]["target"] == ">= 0.7"
    assert "skipped: on CPU" in names["graph: decode"]["note"]
    collected = names["gpu-marked tests collected (smoke: --collect-only, tests/unit/test_gpu.py)"]
    assert int(collected["value"]) > 0
    assert {f"{s} wall time" for s in gs.SECTIONS} <= set(names)

    md = (tmp_path / "gpu_suite.md").read_text()
    assert "torch " in md.splitlines()[0] and "Triton" in md.splitlines()[0] and "CUDA" in md.splitlines()[0]
    for title in ("### Targets", "### kernels", "### train", "### inference", "### tests", "### suite"):
        assert title in md, title
    assert "kernels.backend=auto policy derived" in md
    for sub in ("kernels/kernels.csv", "train/throughput.csv", "inference/inference.csv", "tests/pytest.log"):
        assert (tmp_path / sub).is_file(), sub
    policy = load_policy(tmp_path / gs.POLICY_NAME)  # no Triton timings on CPU: every op stays torch
    assert list(policy) == list(INJECTABLE_OPS) and {p.backend for p in policy.values()} == {"torch"}
