"""CPU smoke of the kernel benchmark script: every case runs at tiny sizes (reference vs eager) and the
CSV / JSON / markdown outputs have the expected rows. The GPU measurements themselves are not tested."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from dsrecipes.benchmarks import kernels as kb

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke: on a GPU main() runs real benchmarks")


@pytest.mark.slow
@pytest.mark.timeout(180)  # 25 s alone; slower when the suite's other worker runs multi-process tests
def test_quick_cpu_smoke_writes_one_row_per_op_and_pass(tmp_path, capsys, monkeypatch):
    # The CPU smoke must never reach a Triton kernel (or a public op's fallback decision).
    def no_triton(*_args, **_kwargs):
        raise AssertionError("a dsrecipes.kernels public op was called in the CPU smoke")

    monkeypatch.setattr("dsrecipes.kernels._utils.triton_unavailable_reason", no_triton)

    rows = kb.main(["--quick", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert kb.GPU_NEEDED in printed

    with open(tmp_path / "kernels.csv") as f:
        csv_rows = list(csv.DictReader(f))
    data = json.loads((tmp_path / "kernels.json").read_text())
    assert len(csv_rows) == len(data["rows"]) == len(rows)
    assert data["device"] == "cpu" and data["quick"] is True
    assert (tmp_path / "kernels.md").read_text().count("\n| ") == len(rows) + 1  # header + one line per row

    assert {r["op"] for r in csv_rows} == set(kb.CASES)
    keys = [(r["op"], r["shape"], r["pass"]) for r in csv_rows]
    assert len(keys) == len(set(keys)), "one row per op, shape and pass"
    for op in kb.CASES:
        passes = {r["pass"] for r in csv_rows if r["op"] == op}
        assert passes in ({"fwd", "bwd", "fwd+bwd"}, {"fwd"}, {"step"}), (op, passes)
    assert {r["pass"] for r in csv_rows if r["op"] == "layer_norm"} == {"fwd", "bwd", "fwd+bwd"}

    for r in csv_rows:
        errors = {k: v for k, v in r.items() if k.endswith("_error") and v}
        assert not errors, (r["op"], r["pass"], errors)
        assert r["subject"] == "reference" and r["device"] == "cpu"
        assert float(r["reference_ms"]) > 0 and float(r["eager_ms"]) > 0 and float(r["speedup_vs_eager"]) > 0
        assert not r["triton_ms"] and not r["compile_ms"]  # no Triton, no torch.compile on the CPU smoke
        unit = "tflops" if r["metric"] == "TFLOP/s" else "gbps"
        assert float(r[f"reference_{unit}"]) > 0, r
