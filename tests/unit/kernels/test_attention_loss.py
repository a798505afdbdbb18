"""Flash attention and cross-entropy kernels against their pure-torch references.

CPU tier: fp32 under the Triton interpreter (TRITON_INTERPRET=1, set by tests/unit/kernels/conftest.py when
CUDA is absent) on tiny, odd shapes so every mask path runs; on a CUDA machine the same tests run the
compiled kernels in fp32. GPU tier (`@pytest.mark.gpu`): bf16 at real shapes against an fp32 reference.
Tolerances are the rows of tests/unit/kernels/TOLERANCES.md (read by conftest.py's `tolerance` fixture).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from dsrecipes.kernels.cross_entropy import (
    cross_entropy,
    cross_entropy_reference,
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_reference,
)
from dsrecipes.kernels.flash_attention import flash_attention, flash_attention_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

F32, BF16 = torch.float32, torch.bfloat16


def _close(actual, expected, tol, msg=""):
    """assert_close in fp32 with `tol` = tolerance(op, dtype) (rows of TOLERANCES.md)."""
    torch.testing.assert_close(actual.float(), expected.float(), **tol, msg=msg or None)


def _no_fallback_warning(record, op):
    hits = [str(w.message) for w in record if f"kernels.{op}:" in str(w.message)]
    assert not hits, f"{op} fell back to the reference: {hits}"


# --------------------------------------------------------------------------------------------------
# Flash attention
# --------------------------------------------------------------------------------------------------


def _attn_inputs(B, hq, hkv, T, D, dtype=torch.float32, device=DEVICE, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, hq, T, D, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
    k = torch.randn(B, hkv, T, D, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
    v = torch.randn(B, hkv, T, D, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
    do = torch.randn(B, hq, T, D, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
    return q, k, v, do


def _attn_run(fn, q, k, v, do, **kw):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v, **kw)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    return o, dq, dk, dv


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("heads", [(4, 2), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("D", [16, 64])
@pytest.mark.parametrize("T", [1, 17, 33])
def test_flash_attention_matches_reference(T, D, heads, causal, tolerance):
    hq, hkv = heads
    q, k, v, do = _attn_inputs(2, hq, hkv, T, D, seed=T * 100 + D)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = _attn_run(flash_attention, q, k, v, do, causal=causal)
    _no_fallback_warning(record, "flash_attention")
    ref = _attn_run(flash_attention_reference, q, k, v, do, causal=causal)
    _close(out[0], ref[0], tolerance("flash_attention (output)", F32), "output")
    for name, a, b in zip(("dq", "dk", "dv"), out[1:], ref[1:]):
        _close(a, b, tolerance("flash_attention (grads)", F32), name)


def test_flash_attention_strided_inputs_and_scale(tolerance):
    """[B, T, H, D] tensors viewed as [B, H, T, D] (no copy) and a non-default softmax scale."""
    B, T, hq, hkv, D = 1, 19, 4, 1, 32
    g = torch.Generator().manual_seed(7)
    q = torch.randn(B, T, hq, D, generator=g).to(DEVICE).transpose(1, 2)
    k = torch.randn(B, T, hkv, D, generator=g).to(DEVICE).transpose(1, 2)
    v = torch.randn(B, T, hkv, D, generator=g).to(DEVICE).transpose(1, 2)
    do = torch.randn(B, hq, T, D, generator=g).to(DEVICE)
    out = _attn_run(flash_attention, q, k, v, do, causal=True, softmax_scale=0.3)
    ref = _attn_run(flash_attention_reference, q, k, v, do, causal=True, softmax_scale=0.3)
    _close(out[0], ref[0], tolerance("flash_attention (output)", F32), "output")
    for name, a, b in zip(("dq", "dk", "dv"), out[1:], ref[1:]):
        _close(a, b, tolerance("flash_attention (grads)", F32), name)


@pytest.mark.parametrize("D", [48, 80, 256])
def test_flash_attention_rejects_head_dim(D):
    q = torch.zeros(1, 2, 4, D)
    with pytest.raises(ValueError, match=r"flash_attention.*\[16, 32, 64, 128\]"):
        flash_attention(q, q, q)


def test_flash_attention_rejects_bad_heads():
    q = torch.zeros(1, 3, 4, 16)
    k = torch.zeros(1, 2, 4, 16)
    with pytest.raises(ValueError, match="flash_attention"):
        flash_attention(q, k, k)


def test_fallback_warns_once_and_matches_reference(fresh_fallback_warnings):
    """bf16 CPU tensors never take the Triton path (the interpreter is fp32-only): the reference answers,
    with one warning per op."""
    q, k, v, _ = _attn_inputs(1, 2, 1, 5, 16, dtype=torch.bfloat16)
    logits = torch.randn(3, 11).bfloat16()
    targets = torch.tensor([1, -100, 4])
    w = torch.randn(11, 16).bfloat16()
    h = torch.randn(3, 16).bfloat16()
    calls = [
        ("flash_attention", lambda: flash_attention(q, k, v), lambda: flash_attention_reference(q, k, v)),
        ("cross_entropy", lambda: cross_entropy(logits, targets), lambda: cross_entropy_reference(logits, targets)),
        ("fused_linear_cross_entropy", lambda: fused_linear_cross_entropy(h, w, targets),
         lambda: fused_linear_cross_entropy_reference(h, w, targets)),
    ]
    for op, fn, ref in calls:
        with pytest.warns(RuntimeWarning, match=op):
            out = fn()
        torch.testing.assert_close(out, ref())
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            fn()
        _no_fallback_warning(record, op)


# --------------------------------------------------------------------------------------------------
# Cross entropy
# --------------------------------------------------------------------------------------------------


def _targets(n, V, ignore=(1, 4, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, V, (n,), generator=g)
    t[list(ignore)] = -100
    t[-1] = V - 1  # the last vocab column, in the last (partial) block
    return t.to(DEVICE)


@pytest.mark.parametrize("V", [37, 1000])
def test_cross_entropy_matches_reference(V, tolerance):
    N = 13
    g = torch.Generator().manual_seed(V)
    x = (3 * torch.randn(N, V, generator=g)).to(DEVICE)
    t = _targets(N, V)
    a = x.clone().requires_grad_()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loss = cross_entropy(a, t)
        loss.backward()
    _no_fallback_warning(record, "cross_entropy")
    b = x.clone().requires_grad_()
    ref = cross_entropy_reference(b, t)
    ref.backward()
    assert loss.dtype == torch.float32 and loss.dim() == 0
    _close(loss, ref, tolerance("cross_entropy", F32), "loss")
    _close(a.grad, b.grad, tolerance("cross_entropy", F32), "grad")
    assert a.grad[[1, 4, 5]].abs().max() == 0  # ignored rows: no gradient


def test_cross_entropy_3d_grad_output_and_inplace(tolerance):
    """[B, T, V] logits, a non-unit incoming grad, and the in-place backward on a non-leaf."""
    B, T, V = 2, 5, 70
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, T, V, generator=g).to(DEVICE)
    t = _targets(B * T, V, ignore=(0, 7)).reshape(B, T)
    results = []
    for fn, kw in ((cross_entropy, {"inplace_backward": True}), (cross_entropy_reference, {})):
        leaf = x.clone().requires_grad_()
        logits = leaf * 1.0
        loss = fn(logits, t, **kw)
        (2.5 * loss).backward()
        results.append((loss, leaf.grad))
    _close(results[0][0], results[1][0], tolerance("cross_entropy", F32), "loss")
    _close(results[0][1], results[1][1], tolerance("cross_entropy", F32), "grad")


def test_cross_entropy_all_ignored_is_nan_with_zero_grad():
    x = torch.randn(4, 9).to(DEVICE).requires_grad_()
    t = torch.full((4,), -100, device=DEVICE)
    loss = cross_entropy(x, t)
    loss.backward()
    assert torch.isnan(loss)  # as torch's mean over zero elements
    assert x.grad.abs().max() == 0


@pytest.mark.parametrize("chunk_size", [4, 5, 13, 64])
@pytest.mark.parametrize("V", [37, 1000])
def test_fused_linear_cross_entropy_matches_reference(V, chunk_size, tolerance):
    N, d = 13, 16
    g = torch.Generator().manual_seed(V + chunk_size)
    h = torch.randn(N, d, generator=g).to(DEVICE)
    w = (0.5 * torch.randn(V, d, generator=g)).to(DEVICE)
    t = _targets(N, V, seed=chunk_size)
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loss = fused_linear_cross_entropy(h1, w1, t, chunk_size=chunk_size)
        (3.0 * loss).backward()
    _no_fallback_warning(record, "fused_linear_cross_entropy")
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    ref = fused_linear_cross_entropy_reference(h2, w2, t)
    (3.0 * ref).backward()
    _close(loss, ref, tolerance("fused_linear_cross_entropy", F32), "loss")
    _close(h1.grad, h2.grad, tolerance("fused_linear_cross_entropy", F32), "grad hidden")
    _close(w1.grad, w2.grad, tolerance("fused_linear_cross_entropy", F32), "grad weight")


def test_fused_linear_cross_entropy_partial_grads_and_no_grad(tolerance):
    """3-D hidden with a frozen weight; and under no_grad (no gradient work) the same loss."""
    B, T, d, V = 2, 3, 16, 50
    g = torch.Generator().manual_seed(11)
    h = torch.randn(B, T, d, generator=g).to(DEVICE)
    w = torch.randn(V, d, generator=g).to(DEVICE)
    t = _targets(B * T, V, ignore=(2,)).reshape(B, T)
    h1 = h.clone().requires_grad_()
    loss = fused_linear_cross_entropy(h1, w, t, chunk_size=4)
    loss.backward()
    h2 = h.clone().requires_grad_()
    ref = fused_linear_cross_entropy_reference(h2, w, t)
    ref.backward()
    tol = tolerance("fused_linear_cross_entropy", F32)
    _close(loss, ref, tol, "loss")
    _close(h1.grad, h2.grad, tol, "grad hidden")
    with torch.no_grad():
        _close(fused_linear_cross_entropy(h, w, t, chunk_size=4), ref.detach(), tol, "no_grad loss")


# --------------------------------------------------------------------------------------------------
# GPU tier: bf16 at real shapes against an fp32 reference
# --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("hkv,causal", [(16, True), (4, False)], ids=["mha-causal", "gqa-full"])
def test_gpu_flash_attention_bf16(hkv, causal, tolerance):
    q, k, v, do = _attn_inputs(2, 16, hkv, 2048, 128, dtype=torch.bfloat16, device="cuda")
    out = _attn_run(flash_attention, q, k, v, do, causal=causal)
    ref = _attn_run(flash_attention_reference, q.float(), k.float(), v.float(), do.float(), causal=causal)
    _close(out[0], ref[0], tolerance("flash_attention (output)", BF16), "output")
    for name, a, b in zip(("dq", "dk", "dv"), out[1:], ref[1:]):
        _close(a, b, tolerance("flash_attention (grads)", BF16), name)


@pytest.mark.gpu
def test_gpu_cross_entropy_bf16(tolerance):
    N, V = 8192, 128256
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (2 * torch.randn(N, V, generator=g, device="cuda")).bfloat16()
    t = torch.randint(0, V, (N,), generator=g, device="cuda")
    t[::7] = -100
    n_valid = int((t != -100).sum())
    a = x.clone().requires_grad_()
    loss = cross_entropy(a, t)
    (loss * n_valid).backward()  # gradients of the summed loss: O(1) entries
    b = x.float().requires_grad_()
    ref = cross_entropy_reference(b, t)
    (ref * n_valid).backward()
    _close(loss, ref, tolerance("cross_entropy (loss)", BF16), "loss")
    _close(a.grad, b.grad, tolerance("cross_entropy (grad)", BF16), "grad")


@pytest.mark.gpu
def test_gpu_fused_linear_cross_entropy_bf16(tolerance):
    N, V, d = 8192, 128256, 2048
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(N, d, generator=g, device="cuda").bfloat16()
    w = (torch.randn(V, d, generator=g, device="cuda") / d**0.5).bfloat16()
    t = torch.randint(0, V, (N,), generator=g, device="cuda")
    t[::5] = -100
    n_valid = int((t != -100).sum())
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = fused_linear_cross_entropy(h1, w1, t, chunk_size=2048)
    (loss * n_valid).backward()
    h2, w2 = h.float().requires_grad_(), w.float().requires_grad_()
    ref = fused_linear_cross_entropy_reference(h2, w2, t)
    (ref * n_valid).backward()
    _close(loss, ref, tolerance("fused_linear_cross_entropy (loss)", BF16), "loss")
    _close(h1.grad, h2.grad, tolerance("fused_linear_cross_entropy (grads)", BF16), "grad hidden")
    _close(w1.grad, w2.grad, tolerance("fused_linear_cross_entropy (grads)", BF16), "grad weight")
