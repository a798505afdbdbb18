"""dsrecipes.benchmarks.gpu_suite: the --smoke run on CPU (in-process) writes both tables with every section,
and the target logic applied to GPU-like rows (no GPU needed). The GPU measurements themselves are not tested."""

from __future__ import annotations

import csv

import pytest
import torch

from dsrecipes.benchmarks import gpu_suite as gs
from dsrecipes.benchmarks import gpu_suite_report as rep
from dsrecipes.benchmarks.inference import known_hbm_gbps
from dsrecipes.benchmarks.train_throughput import base_overrides, run_variants
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
    collected = names["gpu-marked tests collected (smoke: --collect-only, tests/test_gpu.py)"]
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


def test_a_variant_that_does_not_compose_is_a_failed_row(tmp_path):
    rows = run_variants(base_overrides("gpt_debug", 32, 2, 2, 1), ["nosuchgroup=blocks"], tmp_path)
    assert rows[0]["status"] == "failed" and "nosuchgroup" in rows[0]["error"]
    assert {"tokens_per_s", "mfu", "error"} <= set(rows[0])  # the same columns as a measured row
    assert rows[0]["tokens_per_s"] is None
    figs = rep.train_figures(rows, smoke=False)
    assert figs[0].value is None and figs[0].note.startswith("failed: ")


def _kernel_row(op, pass_, triton, eager, compile_, gbps=None, shape="s"):
    return {"op": op, "shape": shape, "pass": pass_, "subject": "triton", "metric": "GB/s" if gbps else "TFLOP/s",
            "triton_ms": triton, "eager_ms": eager, "compile_ms": compile_, "triton_gbps": gbps,
            "speedup_vs_eager": eager / triton, "speedup_vs_compile": compile_ / triton}


def test_targets_on_gpu_like_rows():
    kernels = [_kernel_row("flash_attention", "fwd", 1.0, 0.95, 0.95), _kernel_row("rms_norm", "fwd", 1.0, 1.0, 1.0, 4000.0),
               _kernel_row("layer_norm", "bwd", 1.0, 1.0, 1.0, 3000.0)]
    figs = {f.name: f for f in rep.kernel_figures(kernels, 4800.0, smoke=False)}
    assert figs["target: flash_attention fwd x SDPA (T=4096, D=128)"].met == "yes"  # 0.95 >= 0.9
    assert figs["target: rms_norm fwd fraction of HBM bandwidth"].met == "yes"  # 4000 / 4800 = 0.83
    assert figs["target: layer_norm bwd fraction of HBM bandwidth"].met == "no"  # 0.625

    train = [{"variant": gs.VARIANTS[1], "status": "ok", "tokens_per_s": 1e6, "mfu": 0.45, "peak_mem_gib": 20.0}]
    assert {f.name: f for f in rep.train_figures(train, False)}[f"target: {gs.VARIANTS[1]}: MFU"].met == "no"

    def decode(impl, tok_s, frac):
        return {"impl": impl, "batch": 1, "decode_tok_s": tok_s, "per_token_ms": 1e3 / tok_s, "bandwidth_frac": frac,
                "dtype": "bfloat16", "weight_mib": 2500.0}
    figs = {f.name: f for f in rep.inference_figures([decode("engine", 1000, 0.75), decode("int8", 1500, 0.5)], {}, False)}
    assert figs["target: engine batch 1: fraction of bandwidth roofline"].met == "yes"
    assert figs["target: int8 decode x engine (batch 1)"].met == "no"  # 1.5x < 1.6x
    assert known_hbm_gbps("NVIDIA H200") == 4800 and known_hbm_gbps("NVIDIA H100 80GB HBM3") == 3350
    assert known_hbm_gbps("NVIDIA A10G") is None


def test_junit_counts(tmp_path):
    path = tmp_path / "j.xml"
    path.write_text('<testsuites><testsuite tests="10" failures="1" errors="2" skipped="3"/></testsuites>')
    assert gs._junit_counts(path) == {"passed": 4, "failed": 1, "skipped": 3, "errors": 2}
