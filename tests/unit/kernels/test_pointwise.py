"""Bias+GELU, SwiGLU, RoPE and softmax kernels against their pure-torch references.

CPU tier: fp32 under the Triton interpreter (TRITON_INTERPRET=1, set by conftest.py when CUDA is
absent) on tiny odd shapes: widths that are not powers of two and row counts that are no multiple of
the blocks, several column blocks (bias+GELU at 1500 wide), 2- to 4-D inputs, strided inputs, with
and without bias, packed and separate SwiGLU, causal and not. Every output and every gradient is
compared to torch.autograd through the reference. GPU tier (`gpu` marker): bf16 at real shapes
against the reference in fp32. Tolerances: TOLERANCES.md.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from dsrecipes.kernels.activations import bias_gelu, bias_gelu_reference, swiglu, swiglu_reference
from dsrecipes.kernels.rope import rope, rope_reference
from dsrecipes.kernels.softmax import softmax, softmax_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = torch.float32
BF16 = torch.bfloat16

# A fallback to the reference must not pass silently as a kernel test.
pytestmark = pytest.mark.filterwarnings("error:dsrecipes\\.kernels")


def _randn(*shape, dtype=F32, scale=1.0):
    return (torch.randn(*shape, dtype=F32) * scale).to(DEVICE, dtype)


def _ids(shape):
    return "x".join(map(str, shape))


def _rope_tables(t_max, d, dtype=F32):
    """The model's tables (dsrecipes.models.layers.rope_tables), computed here to keep tests standalone."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=F32) / d))
    angles = torch.outer(torch.arange(t_max, dtype=F32), inv_freq)
    return angles.cos().to(DEVICE, dtype), angles.sin().to(DEVICE, dtype)


# --------------------------------------------------------------------------------------------------
# bias + GELU(tanh)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 37), (3, 23, 100), (2, 3, 1500)], ids=_ids)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_bias_gelu_forward_and_grads(shape, bias, check_against_reference, tolerance):
    torch.manual_seed(0)
    x = _randn(*shape, scale=3.0)
    b = _randn(shape[-1]) if bias else None
    check_against_reference(bias_gelu, bias_gelu_reference, [x, b], tolerance("bias_gelu", F32),
                            expect_fn="BiasGeluFunction")


def test_bias_gelu_matches_torch_gelu_tanh_including_large_inputs(tolerance):
    """Against F.gelu(approximate="tanh") itself, over +-30 where a naive tanh would overflow."""
    x = torch.linspace(-30, 30, 999, device=DEVICE).reshape(27, 37).requires_grad_(True)
    y = bias_gelu(x)
    torch.testing.assert_close(y, F.gelu(x, approximate="tanh"), **tolerance("bias_gelu", F32))
    (g,) = torch.autograd.grad(y.sum(), x)
    x2 = x.detach().requires_grad_(True)
    (g_ref,) = torch.autograd.grad(F.gelu(x2, approximate="tanh").sum(), x2)
    torch.testing.assert_close(g, g_ref, **tolerance("bias_gelu", F32))
    assert torch.isfinite(g).all()


# --------------------------------------------------------------------------------------------------
# SwiGLU
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 37), (3, 7, 100), (2, 2, 3, 64)], ids=_ids)
def test_swiglu_separate_forward_and_grads(shape, check_against_reference, tolerance):
    torch.manual_seed(1)
    gate, up = _randn(*shape, scale=3.0), _randn(*shape)
    check_against_reference(swiglu, swiglu_reference, [gate, up], tolerance("swiglu", F32),
                            expect_fn="SwiGLUFunction")


@pytest.mark.parametrize("shape", [(5, 74), (3, 7, 200)], ids=_ids)
def test_swiglu_packed_forward_and_grads(shape, check_against_reference, tolerance):
    torch.manual_seed(2)
    x = _randn(*shape, scale=3.0)
    outs, _ = check_against_reference(lambda x: swiglu(x), lambda x: swiglu_reference(x), [x],
                                      tolerance("swiglu", F32), expect_fn="SwiGLUFunction")
    assert outs[0].shape == (*shape[:-1], shape[-1] // 2)


def test_swiglu_packed_equals_separate(tolerance):
    torch.manual_seed(3)
    x = _randn(9, 2 * 37).requires_grad_(True)
    gate, up = (t.detach().clone().requires_grad_(True) for t in x.chunk(2, dim=-1))
    dy = _randn(9, 37)
    y_packed, y_sep = swiglu(x), swiglu(gate, up)
    torch.testing.assert_close(y_packed, y_sep, rtol=0, atol=0)
    (y_packed * dy).sum().backward()
    (y_sep * dy).sum().backward()
    torch.testing.assert_close(x.grad, torch.cat([gate.grad, up.grad], dim=-1), rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,t_max,offset", [
    ((2, 3, 5, 16), 5, 0),      # tables exactly T long
    ((1, 2, 9, 10), 16, 3),     # D/2 = 5 (not a power of two), offset into longer tables
    ((2, 4, 37, 64), 40, 0),    # T not a multiple of the position block
], ids=["2x3x5x16", "1x2x9x10-offset3", "2x4x37x64"])
def test_rope_forward_and_grads(shape, t_max, offset, check_against_reference, tolerance):
    torch.manual_seed(4)
    x = _randn(*shape)
    cos, sin = _rope_tables(t_max, shape[-1])
    cos, sin = cos.detach(), sin.detach()
    check_against_reference(
        lambda x: rope(x, cos, sin, offset), lambda x: rope_reference(x, cos, sin, offset),
        [x], tolerance("rope", F32), expect_fn="RoPEFunction",
    )


def test_rope_transposed_and_3d_inputs(check_against_reference, tolerance):
    """q from a [B, T, H, D] projection viewed as [B, H, T, D] (no copy), and a 3-D [B, T, D] input."""
    torch.manual_seed(5)
    cos, sin = _rope_tables(12, 8)
    q = _randn(2, 7, 3, 8).transpose(1, 2)
    assert not q.is_contiguous()
    check_against_reference(lambda q: rope(q, cos, sin), lambda q: rope_reference(q, cos, sin),
                            [q], tolerance("rope", F32), expect_fn="RoPEFunction")
    k = _randn(3, 11, 8)
    check_against_reference(lambda k: rope(k, cos, sin), lambda k: rope_reference(k, cos, sin),
                            [k], tolerance("rope", F32), expect_fn="RoPEFunction")


def test_rope_matches_model_apply_rope(tolerance):
    from dsrecipes.models.layers import apply_rope, rope_tables

    torch.manual_seed(6)
    cos, sin = (t.to(DEVICE) for t in rope_tables(16, 20, 10000.0))
    q = _randn(2, 3, 13, 16)
    torch.testing.assert_close(rope(q, cos, sin), apply_rope(q, cos, sin), **tolerance("rope", F32))


def test_rope_tables_requiring_grad_use_the_reference(tolerance):
    """Learnable tables: the kernel gives no table grads, so rope() takes the (exact) reference path."""
    cos, sin = _rope_tables(6, 8)
    cos.requires_grad_(True)
    x = _randn(1, 2, 6, 8)
    y = rope(x, cos, sin)
    y.sum().backward()
    assert cos.grad is not None and torch.count_nonzero(cos.grad) > 0


# --------------------------------------------------------------------------------------------------
# Softmax
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,causal", [
    ((5, 37), False),
    ((2, 3, 7, 7), False),
    ((2, 3, 7, 7), True),
    ((2, 33, 33), True),       # 66 rows: not a multiple of the 64-row block
    ((3, 100, 100), True),     # 300 rows, 100 keys
], ids=["5x37", "2x3x7x7", "2x3x7x7-causal", "2x33x33-causal", "3x100x100-causal"])
def test_softmax_forward_and_grads(shape, causal, check_against_reference, tolerance):
    torch.manual_seed(7)
    x = _randn(*shape, scale=4.0)
    outs, _ = check_against_reference(lambda x: softmax(x, causal), lambda x: softmax_reference(x, causal),
                                      [x], tolerance("softmax", F32), expect_fn="SoftmaxFunction")
    if causal:
        t = shape[-1]
        masked = torch.ones(t, t, dtype=torch.bool, device=DEVICE).triu(1)
        assert (outs[0].detach()[..., masked] == 0).all()


def test_softmax_large_logits_are_stable(tolerance):
    x = _randn(4, 19, scale=1e3)
    y = softmax(x)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, torch.softmax(x, -1), **tolerance("softmax", F32))


# --------------------------------------------------------------------------------------------------
# Errors and fallback
# --------------------------------------------------------------------------------------------------


def test_pointwise_ops_reject_bad_inputs():
    f64 = torch.randn(4, 8, dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match="bias_gelu.*float64"):
        bias_gelu(f64)
    with pytest.raises(ValueError, match=r"bias_gelu: bias must have shape \(8,\)"):
        bias_gelu(_randn(4, 8), _randn(5))
    with pytest.raises(ValueError, match="swiglu.*float64"):
        swiglu(f64)
    with pytest.raises(ValueError, match="swiglu: a packed .* even last dim"):
        swiglu(_randn(4, 7))
    with pytest.raises(ValueError, match="swiglu: gate and up must have the same shape"):
        swiglu(_randn(4, 8), _randn(4, 9))
    cos, sin = _rope_tables(8, 6)
    with pytest.raises(ValueError, match="rope: the head dim D must be even"):
        rope(_randn(1, 1, 4, 7), cos, sin)
    with pytest.raises(ValueError, match=r"rope: cos must be \[T_max, D/2\]"):
        rope(_randn(1, 1, 4, 8), cos, sin)
    with pytest.raises(ValueError, match="rope: positions .* exceed the tables' 8 rows"):
        rope(_randn(1, 1, 6, 6), cos, sin, offset=3)
    with pytest.raises(ValueError, match="rope.*float64"):
        rope(torch.randn(1, 1, 4, 6, dtype=torch.float64, device=DEVICE), cos, sin)
    with pytest.raises(ValueError, match="softmax: causal=True needs square"):
        softmax(_randn(2, 4, 5), causal=True)
    with pytest.raises(ValueError, match="softmax.*float64"):
        softmax(f64)


@pytest.mark.filterwarnings("default")
def test_pointwise_ops_fall_back_with_one_warning_each(fresh_fallback_warnings):
    """CPU bf16 cannot take the Triton path (interpreter: fp32 only; else: no CUDA tensor)."""
    x = torch.randn(3, 4, 8).bfloat16()
    cos, sin = _rope_tables(8, 8)
    calls = {
        "bias_gelu": (lambda: bias_gelu(x[0], x[0, 0]), lambda: bias_gelu_reference(x[0], x[0, 0])),
        "swiglu": (lambda: swiglu(x), lambda: swiglu_reference(x)),
        "rope": (lambda: rope(x, cos.cpu(), sin.cpu()), lambda: rope_reference(x, cos.cpu(), sin.cpu())),
        "softmax": (lambda: softmax(x[0, :, :4], True), lambda: softmax_reference(x[0, :, :4], True)),
    }
    for op, (call, ref) in calls.items():
        with pytest.warns(RuntimeWarning, match=f"kernels.{op}:"):
            y = call()
        torch.testing.assert_close(y, ref(), rtol=0, atol=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            call()  # once per op, not per call


# --------------------------------------------------------------------------------------------------
# GPU tier: bf16 at real shapes vs the fp32 reference
# --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_bias_gelu_bf16_real_shape(check_against_reference, tolerance):
    torch.manual_seed(10)
    x, b = _randn(4, 1024, 4 * 1024, dtype=BF16, scale=2.0), _randn(4 * 1024, dtype=BF16)
    check_against_reference(bias_gelu, bias_gelu_reference, [x, b], tolerance("bias_gelu", BF16),
                            ref_dtype=F32, expect_fn="BiasGeluFunction")


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
def test_swiglu_bf16_real_shape(packed, check_against_reference, tolerance):
    torch.manual_seed(11)
    if packed:
        args, fn, ref = [_randn(4096, 2 * 11008, dtype=BF16, scale=2.0)], (lambda x: swiglu(x)), (
            lambda x: swiglu_reference(x))
    else:
        args, fn, ref = [_randn(4096, 11008, dtype=BF16, scale=2.0), _randn(4096, 11008, dtype=BF16)], swiglu, \
            swiglu_reference
    check_against_reference(fn, ref, args, tolerance("swiglu", BF16), ref_dtype=F32, expect_fn="SwiGLUFunction")


@pytest.mark.gpu
def test_rope_bf16_real_shape(check_against_reference, tolerance):
    torch.manual_seed(12)
    cos, sin = _rope_tables(4096, 128)
    q = _randn(4, 2048, 32, 128, dtype=BF16).transpose(1, 2)
    check_against_reference(lambda q: rope(q, cos, sin), lambda q: rope_reference(q, cos, sin), [q],
                            tolerance("rope", BF16), ref_dtype=F32, expect_fn="RoPEFunction")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softmax_bf16_real_shape(causal, check_against_reference, tolerance):
    torch.manual_seed(13)
    x = _randn(2, 16, 1024, 1024, dtype=BF16, scale=3.0)
    check_against_reference(lambda x: softmax(x, causal), lambda x: softmax_reference(x, causal), [x],
                            tolerance("softmax", BF16), ref_dtype=F32, expect_fn="SoftmaxFunction",
                            grad_tol=tolerance("softmax_grad", BF16))
