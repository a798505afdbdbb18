"""dsrecipes.benchmarks.gpu_suite: the --smoke run on CPU (in-process) writes both tables with every section,
and the target logic applied to GPU-like rows (no GPU needed). The GPU measurements themselves are not tested."""

from __future__ import annotations

from dsrecipes.benchmarks import gpu_suite as gs
from dsrecipes.benchmarks import gpu_suite_report as rep
from dsrecipes.benchmarks.inference import known_hbm_gbps
from dsrecipes.benchmarks.train_throughput import base_overrides, run_variants


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
