"""LayerNorm and RMSNorm kernels (dsrecipes.kernels.layer_norm / rms_norm) against their references.

CPU tier: fp32 under the Triton interpreter (TRITON_INTERPRET=1, set by conftest.py when CUDA is
absent) on tiny odd shapes: hidden sizes that are not powers of two (37, 100, 1000), row counts that
are no multiple of the row block (so the masked tail and the multi-program weight-grad reduction
both run), 2-, 3- and 4-D inputs, with and without bias / weight / fused residual. Every output and
every gradient is compared to torch.autograd through the reference. GPU tier (`gpu` marker): bf16 at
4096 x 4096 against the reference in fp32. Tolerances: TOLERANCES.md.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dsrecipes.kernels.layer_norm import FusedLayerNorm, layer_norm, layer_norm_reference
from dsrecipes.kernels.rms_norm import FusedRMSNorm, rms_norm, rms_norm_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = torch.float32

# A fallback to the reference must not pass silently as a kernel test.
pytestmark = pytest.mark.filterwarnings("error:dsrecipes\\.kernels")

# (shape, what it exercises); row blocks are 4096 // next_pow2(N) rows: 64, 32, 64, 4 here.
SHAPES = [(5, 37), (3, 23, 100), (2, 3, 5, 64), (10, 1000)]


def _randn(*shape, dtype=F32, scale=1.0, shift=0.0):
    return (torch.randn(*shape, dtype=F32) * scale + shift).to(DEVICE, dtype)


def _inputs(shape, residual, bias, dtype=F32):
    n = shape[-1]
    x = _randn(*shape, dtype=dtype, scale=2.0, shift=0.5)
    w = _randn(n, dtype=dtype, shift=1.0)
    b = _randn(n, dtype=dtype) if bias else None
    r = _randn(*shape, dtype=dtype) if residual else None
    return x, w, b, r


# --------------------------------------------------------------------------------------------------
# LayerNorm
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_layer_norm_forward_and_grads(shape, residual, bias, check_against_reference, tolerance):
    torch.manual_seed(0)
    x, w, b, r = _inputs(shape, residual, bias)
    check_against_reference(
        lambda x, w, b, r: layer_norm(x, w, b, 1e-5, r),
        lambda x, w, b, r: layer_norm_reference(x, w, b, 1e-5, r),
        [x, w, b, r], tolerance("layer_norm", F32), expect_fn="LayerNormFunction",
    )


def test_layer_norm_without_weight_and_eps(check_against_reference, tolerance):
    torch.manual_seed(1)
    x = _randn(7, 33, scale=1e-2)  # tiny variance: eps matters
    check_against_reference(
        lambda x: layer_norm(x, None, None, 1e-3),
        lambda x: layer_norm_reference(x, None, None, 1e-3),
        [x], tolerance("layer_norm", F32), expect_fn="LayerNormFunction",
    )


@pytest.mark.parametrize("use_sum", [False, True], ids=["y-only", "sum-only"])
def test_layer_norm_residual_one_output_used(use_sum, check_against_reference, tolerance):
    """Only y (or only the returned sum) feeds the loss: the other output's grad is None."""
    torch.manual_seed(2)
    x, w, b, r = _inputs((3, 11, 100), True, True)

    def grads(outs):
        g = [torch.randn_like(o) for o in outs]
        return [None, g[1]] if use_sum else [g[0], None]

    check_against_reference(
        lambda x, w, b, r: layer_norm(x, w, b, 1e-5, r),
        lambda x, w, b, r: layer_norm_reference(x, w, b, 1e-5, r),
        [x, w, b, r], tolerance("layer_norm", F32), grad_outputs=grads, expect_fn="LayerNormFunction",
    )


def test_layer_norm_strided_inputs(check_against_reference, tolerance):
    """A column slice (row stride != N) and a transposed tensor (column stride != 1)."""
    torch.manual_seed(3)
    x = _randn(9, 50)[:, :37]
    r = _randn(37, 9).t()
    w, b = _randn(37), _randn(37)
    check_against_reference(
        lambda x, w, b, r: layer_norm(x, w, b, 1e-5, r),
        lambda x, w, b, r: layer_norm_reference(x, w, b, 1e-5, r),
        [x, w, b, r], tolerance("layer_norm", F32), expect_fn="LayerNormFunction",
    )


@pytest.mark.parametrize("bias", [True, False])
def test_fused_layer_norm_module_matches_torch(bias, tolerance):
    torch.manual_seed(4)
    ref = nn.LayerNorm(100, eps=1e-6, bias=bias).to(DEVICE)
    with torch.no_grad():
        ref.weight.normal_()
        if bias:
            ref.bias.normal_()
    mod = FusedLayerNorm(100, eps=1e-6, bias=bias).to(DEVICE)
    mod.load_state_dict(ref.state_dict())
    assert set(mod.state_dict()) == set(ref.state_dict()) == ({"weight", "bias"} if bias else {"weight"})
    ref.load_state_dict(mod.state_dict())
    x = _randn(2, 13, 100)
    torch.testing.assert_close(mod(x), ref(x), **tolerance("layer_norm", F32))
    y, s = mod(x, x)
    torch.testing.assert_close(s, x + x)
    torch.testing.assert_close(y, ref(x + x), **tolerance("layer_norm", F32))


# --------------------------------------------------------------------------------------------------
# RMSNorm
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_rms_norm_forward_and_grads(shape, residual, check_against_reference, tolerance):
    torch.manual_seed(5)
    x, w, _, r = _inputs(shape, residual, False)
    check_against_reference(
        lambda x, w, r: rms_norm(x, w, 1e-5, r),
        lambda x, w, r: rms_norm_reference(x, w, 1e-5, r),
        [x, w, r], tolerance("rms_norm", F32), expect_fn="RMSNormFunction",
    )


def test_rms_norm_without_weight_and_y_only(check_against_reference, tolerance):
    torch.manual_seed(6)
    x, r = _randn(4, 9, 37), _randn(4, 9, 37)
    check_against_reference(
        lambda x, r: rms_norm(x, None, 1e-6, r),
        lambda x, r: rms_norm_reference(x, None, 1e-6, r),
        [x, r], tolerance("rms_norm", F32), expect_fn="RMSNormFunction",
        grad_outputs=lambda outs: [torch.randn_like(outs[0]), None],
    )


def test_fused_rms_norm_state_dict_interchangeable(tolerance):
    """Same `weight` as dsrecipes.models.layers.RMSNorm and torch.nn.RMSNorm; same outputs."""
    from dsrecipes.models.layers import RMSNorm

    torch.manual_seed(7)
    model_norm = RMSNorm(100, eps=1e-5).to(DEVICE)
    with torch.no_grad():
        model_norm.weight.normal_()
    mod = FusedRMSNorm(100, eps=1e-5).to(DEVICE)
    mod.load_state_dict(model_norm.state_dict())
    torch_norm = nn.RMSNorm(100, eps=1e-5).to(DEVICE)
    torch_norm.load_state_dict(mod.state_dict())
    model_norm.load_state_dict(mod.state_dict())
    x = _randn(3, 5, 100)
    tol = tolerance("rms_norm", F32)
    torch.testing.assert_close(mod(x), model_norm(x), **tol)
    torch.testing.assert_close(mod(x), torch_norm(x), **tol)


# --------------------------------------------------------------------------------------------------
# Errors and fallback
# --------------------------------------------------------------------------------------------------


def test_norms_reject_bad_dtype_and_shapes():
    x = torch.randn(4, 8, dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match="layer_norm.*float64"):
        layer_norm(x, None, None)
    with pytest.raises(ValueError, match="rms_norm.*float64"):
        rms_norm(x)
    with pytest.raises(ValueError, match="rms_norm.*int64"):
        rms_norm(torch.ones(4, 8, dtype=torch.int64, device=DEVICE))
    x = _randn(4, 8)
    with pytest.raises(ValueError, match=r"layer_norm: weight must have shape \(8,\)"):
        layer_norm(x, _randn(7), None)
    with pytest.raises(ValueError, match=r"layer_norm: bias must have shape \(8,\)"):
        layer_norm(x, _randn(8), _randn(9))
    with pytest.raises(ValueError, match="rms_norm: residual must have x's shape"):
        rms_norm(x, _randn(8), residual=_randn(4, 9))
    with pytest.raises(ValueError, match="layer_norm: the last dimension must be <= 65536"):
        layer_norm(torch.empty(1, 65537, device=DEVICE), None, None)


@pytest.mark.filterwarnings("default")
def test_norms_fall_back_to_reference_with_one_warning(fresh_fallback_warnings):
    """CPU bf16 cannot take the Triton path (interpreter: fp32 only; else: no CUDA tensor)."""
    x = torch.randn(6, 37).bfloat16()
    w = torch.randn(37).bfloat16()
    with pytest.warns(RuntimeWarning, match="layer_norm"):
        y = layer_norm(x, w, None)
    torch.testing.assert_close(y, layer_norm_reference(x, w, None))
    with pytest.warns(RuntimeWarning, match="rms_norm"):
        y, s = rms_norm(x, w, residual=x)
    torch.testing.assert_close(y, rms_norm_reference(x, w, residual=x)[0])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer_norm(x, w, None)  # warned once per op, not per call
        rms_norm(x, w)


# --------------------------------------------------------------------------------------------------
# GPU tier: bf16 at real shapes vs the fp32 reference
# --------------------------------------------------------------------------------------------------


def _stored_sum_reference(ref, dtype):
    """The fp32 reference with the op's contract for the residual sum: s = x + residual is stored in
    `dtype` (the residual's, bf16 here) and that stored s is normalized. Rounding is applied to the
    value only (straight-through gradient), as the kernel's backward treats it. Without this, the fp32
    reference normalizes the unrounded sum and dweight differs by more than bf16 tolerances."""

    def fn(x, w, *rest):
        *b, r = rest
        s = x + r
        s = s + (s.to(dtype).to(s.dtype) - s).detach()
        return ref(s, w, *b), s

    return fn


@pytest.mark.gpu
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_layer_norm_bf16_4096(residual, check_against_reference, tolerance):
    torch.manual_seed(10)
    x, w, b, r = _inputs((4096, 4096), residual, True, dtype=torch.bfloat16)
    check_against_reference(
        lambda x, w, b, r: layer_norm(x, w, b, 1e-5, r),
        _stored_sum_reference(lambda s, w, b: layer_norm_reference(s, w, b, 1e-5), torch.bfloat16) if residual
        else (lambda x, w, b, r: layer_norm_reference(x, w, b, 1e-5)),
        [x, w, b, r], tolerance("layer_norm", torch.bfloat16), ref_dtype=F32, expect_fn="LayerNormFunction",
    )


@pytest.mark.gpu
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_rms_norm_bf16_4096(residual, check_against_reference, tolerance):
    torch.manual_seed(11)
    x, w, _, r = _inputs((2, 2048, 4096), residual, False, dtype=torch.bfloat16)
    check_against_reference(
        lambda x, w, r: rms_norm(x, w, 1e-5, r),
        _stored_sum_reference(lambda s, w: rms_norm_reference(s, w, 1e-5), torch.bfloat16) if residual
        else (lambda x, w, r: rms_norm_reference(x, w, 1e-5)),
        [x, w, r], tolerance("rms_norm", torch.bfloat16), ref_dtype=F32, expect_fn="RMSNormFunction",
    )


@pytest.mark.gpu
def test_rms_norm_bf16_wide_rows_fp32_residual(check_against_reference, tolerance):
    """Hidden 8192 (a tile of one row), bf16 activations with an fp32 residual stream."""
    torch.manual_seed(12)
    x = _randn(1000, 8192, dtype=torch.bfloat16)
    r = _randn(1000, 8192)
    w = _randn(8192, dtype=torch.bfloat16, shift=1.0)
    outs, _ = check_against_reference(
        lambda x, w, r: rms_norm(x, w, 1e-5, r),
        lambda x, w, r: rms_norm_reference(x, w, 1e-5, r),
        [x, w, r], tolerance("rms_norm", torch.bfloat16), ref_dtype=F32, expect_fn="RMSNormFunction",
    )
    assert outs[0].dtype == torch.bfloat16 and outs[1].dtype == torch.float32
