"""kernels.backend=auto's measured per-op policy: the packaged file, the decision, and deriving a policy from a
kernel benchmark table. CPU only and cheap: no kernel runs (CUDA is faked by device type)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from dsrecipes.models import GPT, ModelConfig
from dsrecipes.models import kernel_injection as ki
from dsrecipes.models.kernel_policy import (
    INJECTABLE_OPS,
    POLICY_FILE,
    OpPolicy,
    choose_ops,
    describe_choices,
    load_policy,
    policy_from_kernel_rows,
    policy_json,
)
from tests.helpers.paths import REPO

ROOT = REPO


def test_packaged_policy_covers_every_injectable_op_and_ships_with_the_package():
    policy = load_policy()
    assert list(policy) == list(INJECTABLE_OPS)
    # Seeded from the H200 table in docs/benchmarks.md: only cross-entropy measured faster in Triton.
    assert {op for op, p in policy.items() if p.backend == "triton"} == {"cross_entropy"}
    assert policy["cross_entropy"].ratio == 7.9 and policy["cross_entropy"].hardware == "NVIDIA H200"
    for op in ("layer_norm", "rms_norm", "swiglu", "flash_attention"):
        assert policy[op].ratio < 1 and policy[op].backend == "torch", op
    for op in ("bias_gelu", "rope"):  # never measured -> torch
        assert policy[op].ratio is None and policy[op].backend == "torch" and "never measured" in policy[op].reason()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert POLICY_FILE.name in package_data["dsrecipes.models"]
    assert POLICY_FILE.parent == Path(ki.__file__).parent


def test_injectable_ops_are_what_inject_kernels_swaps():
    # every op name is checked in kernel_injection (a new swap must get a policy entry, and vice versa)
    source = Path(ki.__file__).read_text()
    for op in INJECTABLE_OPS:
        assert f'"{op}" in ops' in source, op


def test_bad_policy_files_name_the_file_and_the_key(tmp_path):
    ops = {op: {"backend": "torch"} for op in INJECTABLE_OPS}
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"ops": {**ops, "cross_entropy": {"backend": "cuda"}}}))
    with pytest.raises(ValueError, match=r"ops\.cross_entropy\.backend='cuda'.*triton, torch"):
        load_policy(bad)
    del ops["rope"]
    bad.write_text(json.dumps({"ops": ops}))
    with pytest.raises(ValueError, match=r"p\.json.*missing \['rope'\]"):
        load_policy(bad)


def test_choose_ops_per_backend_and_device():
    policy = load_policy()
    auto_cuda = choose_ops("auto", "cuda", policy, triton_ok=True)
    assert {op for op, c in auto_cuda.items() if c.backend == "triton"} == {"cross_entropy"}
    assert auto_cuda["cross_entropy"].reason.startswith("7.90x torch on NVIDIA H200")
    assert auto_cuda["layer_norm"].backend == "torch" and "0.21x" in auto_cuda["layer_norm"].reason
    assert all(c.backend == "torch" for c in choose_ops("auto", "cpu", policy).values())
    assert all(c.backend == "torch" for c in choose_ops("auto", "cuda", policy, triton_ok=False).values())
    assert all(c.backend == "triton" for c in choose_ops("triton", "cpu", policy).values())
    assert all(c.backend == "torch" for c in choose_ops("torch", "cuda", policy).values())
    with pytest.raises(ValueError, match="kernels.backend='fast'"):
        choose_ops("fast", "cuda", policy)

    lines = describe_choices("auto", auto_cuda)
    assert lines[len(lines) - 1].startswith("auto: cross_entropy -> triton (7.90x torch on NVIDIA H200")
    assert len(lines) == len(INJECTABLE_OPS)
    assert describe_choices("auto", choose_ops("auto", "cpu", policy)) == [
        "auto: every op -> torch (the model is on cpu, not CUDA)"]
    assert describe_choices("triton", choose_ops("triton", "cpu", policy)) == []


def test_inject_kernels_auto_decision_on_a_fake_cuda_model(monkeypatch):
    model = GPT(ModelConfig(style="gpt2", n_layer=1, n_head=2, d_model=32, vocab_size=64, max_seq_len=16))
    monkeypatch.setattr(ki, "_device_type", lambda _model: "cuda")
    monkeypatch.setattr("dsrecipes.kernels._utils.triton_available", lambda: True)
    choices = ki.kernel_choices(model, "auto")
    assert {op for op, c in choices.items() if c.backend == "triton"} == {"cross_entropy"}
    assert {op for op, c in ki.kernel_choices(model, "triton").items() if c.backend == "triton"} == set(INJECTABLE_OPS)

    # an all-torch policy: auto swaps nothing (no kernel module imported) and says why, per op
    all_torch = {op: OpPolicy("torch", ratio=0.5, hardware="H100", pass_="fwd+bwd") for op in INJECTABLE_OPS}
    lines = ki.inject_kernels(model, "auto", policy=all_torch)
    assert lines == ["auto: every op -> torch (0.50x torch on H100 (fwd+bwd))"]
    assert model.loss_fn is None

    monkeypatch.setattr(ki, "_device_type", lambda _model: "cpu")
    assert ki.inject_kernels(model, "auto") == ["auto: every op -> torch (the model is on cpu, not CUDA)"]
    assert ki.inject_kernels(model, "torch") == []


def _row(op, pass_, triton, eager, compile_):
    return {"op": op, "shape": "s", "pass": pass_, "triton_ms": triton, "eager_ms": eager, "compile_ms": compile_}


def test_policy_from_kernel_rows_picks_triton_only_when_faster_than_eager_and_compile(tmp_path):
    rows = [
        _row("cross_entropy", "fwd", 9.0, 1.0, 1.0),  # fwd+bwd decides, not fwd
        _row("cross_entropy", "fwd+bwd", 1.0, 8.0, 2.0),  # faster than both -> triton, ratio 2.0
        _row("layer_norm", "fwd+bwd", 1.0, 0.9, 3.0),  # slower than eager -> torch
        _row("rms_norm", "fwd+bwd", 1.0, 2.0, 0.5),  # slower than compile -> torch
        _row("swiglu", "fwd+bwd", 1.0, 1.0, None),  # ties eager, compile not timed -> triton
        _row("flash_attention", "fwd+bwd", None, 1.0, 1.0),  # the Triton op failed -> torch
        {"op": "rope", "shape": "s", "pass": "fwd+bwd", "triton_ms": "", "reference_ms": "1.0", "eager_ms": "2.0",
         "compile_ms": ""},  # the CPU smoke (csv strings): no Triton timing -> torch
        _row("softmax", "fwd+bwd", 1.0, 5.0, 5.0),  # not injectable: ignored
    ]
    policy = policy_from_kernel_rows(rows, "NVIDIA H200", "2027-01-01", "gpu_suite")
    assert list(policy) == list(INJECTABLE_OPS)
    chosen = {op: p.backend for op, p in policy.items()}
    assert chosen == {"layer_norm": "torch", "rms_norm": "torch", "bias_gelu": "torch", "swiglu": "triton",
                      "rope": "torch", "flash_attention": "torch", "cross_entropy": "triton"}
    assert policy["cross_entropy"].ratio == 2.0 and policy["cross_entropy"].pass_ == "fwd+bwd"
    assert policy["layer_norm"].ratio == 0.9 and policy["rms_norm"].ratio == 0.5
    assert "never measured" in policy["bias_gelu"].source
    # forward-only ops (no gradient) are decided on fwd
    fwd_only = policy_from_kernel_rows([_row("rope", "fwd", 1.0, 2.0, 2.0)], "H", "d", "s")
    assert fwd_only["rope"].backend == "triton" and fwd_only["rope"].pass_ == "fwd"

    path = tmp_path / "policy.json"
    path.write_text(policy_json(policy, "test"))
    assert load_policy(path) == policy
