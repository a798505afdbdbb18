"""Fused AdamW, int8 quantization and the int8 weight-only matmul against their references.

CPU tier: fp32 under the Triton interpreter (TRITON_INTERPRET=1, set by conftest.py without CUDA) on
small odd shapes: tensors of 37 and 1000 elements and a 2-D [17, 33] one (AdamW over several steps
vs torch.optim.AdamW(foreach=False), with weight decay and the model-copy output), quantization with
symmetric/asymmetric modes and channel/group granularity (q, scale, zero_point bit-equal to the
reference; round trip within scale/2), the matmul with K not a multiple of the K block. GPU tier
(`gpu` marker): bf16 at real shapes. Tolerances: TOLERANCES.md.
"""

from __future__ import annotations

import copy

import pytest
import torch

from dsrecipes.kernels.fused_adamw import FusedAdamW, fused_adamw_reference, fused_adamw_step
from dsrecipes.kernels.int8_matmul import int8_weight_only_matmul, int8_weight_only_matmul_reference
from dsrecipes.kernels.quantization import (
    dequantize_int8,
    dequantize_int8_reference,
    quantize_int8,
    quantize_int8_reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = torch.float32
BF16 = torch.bfloat16

# A fallback to the reference must not pass silently as a kernel test.
pytestmark = pytest.mark.filterwarnings("error:dsrecipes\\.kernels")

SHAPES = [(37,), (1000,), (17, 33)]


def _randn(*shape, dtype=F32, scale=1.0, shift=0.0):
    return (torch.randn(*shape, dtype=F32) * scale + shift).to(DEVICE, dtype)


# --------------------------------------------------------------------------------------------------
# Fused AdamW
# --------------------------------------------------------------------------------------------------


def _torch_and_fused(shapes, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, maximize=False):
    ps = [_randn(*s) for s in shapes]
    ref = [p.clone().requires_grad_(True) for p in ps]
    mine = [p.clone().requires_grad_(True) for p in ps]
    opt_ref = torch.optim.AdamW(ref, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False,
                                maximize=maximize)
    opt = FusedAdamW(mine, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize)
    return ref, opt_ref, mine, opt


def _set_grads(ref, mine, scale=1.0):
    for r, m in zip(ref, mine):
        g = torch.randn(r.shape, dtype=F32).to(DEVICE) * scale
        r.grad = g.clone()
        m.grad = g.clone()


def _assert_same_state(opt_ref, opt, ref, mine, tol):
    for r, m in zip(ref, mine):
        torch.testing.assert_close(m.detach(), r.detach(), **tol)
        sr, sm = opt_ref.state[r], opt.state[m]
        assert float(sm["step"]) == float(sr["step"])
        torch.testing.assert_close(sm["exp_avg"], sr["exp_avg"], **tol)
        torch.testing.assert_close(sm["exp_avg_sq"], sr["exp_avg_sq"], **tol)


@pytest.mark.parametrize("weight_decay,maximize", [(0.1, False), (0.0, False), (0.05, True)],
                         ids=["wd", "no-wd", "maximize"])
def test_fused_adamw_matches_torch_adamw(weight_decay, maximize, tolerance):
    torch.manual_seed(0)
    ref, opt_ref, mine, opt = _torch_and_fused(SHAPES, weight_decay=weight_decay, maximize=maximize)
    for step in range(4):
        _set_grads(ref, mine, scale=10.0 ** (step - 2))  # grads from 1e-2 to 10: bias correction and eps matter
        opt_ref.step()
        opt.step()
    _assert_same_state(opt_ref, opt, ref, mine, tolerance("fused_adamw", F32))
    assert opt.state[mine[0]]["step"].dtype == torch.float32


def test_fused_adamw_step_functional_with_model_copy(tolerance):
    """The functional form against the reference, writing the updated weights into model copies
    (fp32 under the interpreter; bf16 in the GPU tier); a None entry leaves that param without one."""
    torch.manual_seed(1)
    ps = [_randn(*s) for s in SHAPES]
    states = [[p.clone(), torch.zeros_like(p), torch.zeros_like(p)] for p in ps]
    ref_states = [[t.clone() for t in st] for st in states]
    copies = [torch.full_like(p, float("nan")) for p in ps]
    copies[1] = None
    tol = tolerance("fused_adamw", F32)
    for step in range(1, 4):
        gs = [_randn(*s) for s in SHAPES]
        fused_adamw_step([s[0] for s in states], gs, [s[1] for s in states], [s[2] for s in states], step,
                         1e-3, 0.9, 0.95, 1e-8, 0.1, model_params=copies)
        fused_adamw_reference([s[0] for s in ref_states], gs, [s[1] for s in ref_states],
                              [s[2] for s in ref_states], step, 1e-3, 0.9, 0.95, 1e-8, 0.1)
    for st, rst, c in zip(states, ref_states, copies):
        for a, b in zip(st, rst):
            torch.testing.assert_close(a, b, **tol)
        if c is not None:
            torch.testing.assert_close(c, st[0], rtol=0, atol=0)


def test_fused_adamw_noncontiguous_and_linked_model_param(tolerance):
    torch.manual_seed(2)
    base = _randn(33, 17)
    ref = base.t().clone().requires_grad_(True)
    mine = base.clone().t().requires_grad_(True)  # a transposed (non-contiguous) leaf
    assert not mine.is_contiguous()
    opt_ref = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.1, foreach=False)
    opt = FusedAdamW([mine], lr=1e-2, weight_decay=0.1)
    copy = torch.zeros(17, 33, device=DEVICE)
    opt.link_model_param(mine, copy)
    for _ in range(3):
        g = _randn(17, 33)
        ref.grad, mine.grad = g.clone(), g.clone()
        opt_ref.step()
        opt.step()
    _assert_same_state(opt_ref, opt, [ref], [mine], tolerance("fused_adamw", F32))
    torch.testing.assert_close(copy, mine.detach(), rtol=0, atol=0)


def test_fused_adamw_state_dict_round_trip(tolerance):
    """torch AdamW -> FusedAdamW -> torch AdamW state dicts, training continuing identically."""
    torch.manual_seed(3)
    ref, opt_ref, mine, opt = _torch_and_fused([(37,), (17, 33)], weight_decay=0.02)
    tol = tolerance("fused_adamw", F32)
    for _ in range(2):
        _set_grads(ref, mine)
        opt_ref.step()
        opt.step()
    # torch's state dict into ours (and ours into a fresh torch AdamW)
    opt2 = FusedAdamW(mine, lr=0.5)
    # deep copies: load_state_dict keeps the loaded tensors as they are (no copy when dtype and device
    # match), so loading a live state dict would make both optimizers update the same moments
    opt2.load_state_dict(copy.deepcopy(opt_ref.state_dict()))
    assert opt2.param_groups[0]["lr"] == 1e-2
    sd = copy.deepcopy(opt2.state_dict())
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert set(opt.state_dict()["param_groups"][0]) <= set(opt_ref.state_dict()["param_groups"][0])
    ref2 = [p.detach().clone().requires_grad_(True) for p in mine]
    opt_ref2 = torch.optim.AdamW(ref2, lr=0.5, foreach=False)
    opt_ref2.load_state_dict(sd)
    for _ in range(2):
        _set_grads(ref2, mine)
        opt_ref2.step()
        opt2.step()
    _assert_same_state(opt_ref2, opt2, ref2, mine, tol)
    # and a round trip of our own state dict
    opt3 = FusedAdamW(mine)
    opt3.load_state_dict(copy.deepcopy(opt2.state_dict()))
    for key in ("exp_avg", "exp_avg_sq", "step"):
        torch.testing.assert_close(opt3.state[mine[1]][key], opt2.state[mine[1]][key], rtol=0, atol=0)


def test_fused_adamw_rejects_bad_inputs():
    p = _randn(8)
    with pytest.raises(ValueError, match="fused_adamw.*same length"):
        fused_adamw_step([p], [], [p.clone()], [p.clone()], 1, 1e-3, 0.9, 0.999, 1e-8, 0.0)
    with pytest.raises(ValueError, match="fused_adamw: param 0: .*shapes differ"):
        fused_adamw_step([p], [_randn(9)], [p.clone()], [p.clone()], 1, 1e-3, 0.9, 0.999, 1e-8, 0.0)
    with pytest.raises(ValueError, match="fused_adamw.*bfloat16"):
        fused_adamw_step([p.to(BF16)], [p], [p.clone()], [p.clone()], 1, 1e-3, 0.9, 0.999, 1e-8, 0.0)
    with pytest.raises(ValueError, match="fused_adamw.*float64"):
        fused_adamw_step([p], [p.double()], [p.clone()], [p.clone()], 1, 1e-3, 0.9, 0.999, 1e-8, 0.0)
    with pytest.raises(ValueError, match="fused_adamw: param 0: model copy shape"):
        fused_adamw_step([p], [p], [p.clone()], [p.clone()], 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, model_params=[_randn(3)])
    with pytest.raises(ValueError, match="fused_adamw: step must be >= 1"):
        fused_adamw_step([p], [p], [p.clone()], [p.clone()], 0, 1e-3, 0.9, 0.999, 1e-8, 0.0)
    with pytest.raises(ValueError, match="fused_adamw: amsgrad"):
        FusedAdamW([p.requires_grad_()], amsgrad=True)


# --------------------------------------------------------------------------------------------------
# Quantization
# --------------------------------------------------------------------------------------------------

QUANT_CASES = [
    ((17, 33), "channel", None),
    ((5, 1000), "channel", None),
    ((3, 7, 96), "channel", None),
    ((17, 64), "group", 32),
    ((9, 192), "group", 64),
    ((4, 256), "group", 128),
]


def _quant_weight(shape):
    w = _randn(*shape, scale=0.5)
    w[0].zero_()  # an all-zero row/group: scale 1, q 0
    if len(shape) == 2 and shape[0] > 2:
        w[1] = w[1].abs() + 0.1  # all positive: asymmetric zero point at -128
        w[2] = -w[2].abs() - 0.1  # all negative
    return w


@pytest.mark.parametrize("mode", ["symmetric", "asymmetric"])
@pytest.mark.parametrize("shape,granularity,group_size", QUANT_CASES,
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_quantize_matches_reference_and_round_trips(shape, granularity, group_size, mode):
    torch.manual_seed(4)
    w = _quant_weight(shape)
    kw = dict(mode=mode, granularity=granularity, group_size=group_size or 128)
    q, scale, zp = quantize_int8(w, **kw)
    rq, rscale, rzp = quantize_int8_reference(w, **kw)
    gs = shape[-1] if granularity == "channel" else group_size
    assert q.dtype == torch.int8 and q.shape == w.shape
    assert scale.dtype == torch.float32 and scale.shape == (*shape[:-1], shape[-1] // gs)
    assert torch.equal(q, rq) and torch.equal(scale, rscale)
    if mode == "symmetric":
        assert zp is None and rzp is None
        assert int(q.abs().max()) <= 127
    else:
        assert zp.dtype == torch.int32 and torch.equal(zp, rzp)
    d = dequantize_int8(q, scale, zp)
    assert torch.equal(d, dequantize_int8_reference(q, scale, zp))
    per_elem_scale = scale.repeat_interleave(gs, dim=-1)
    err = (d - w).abs()
    assert bool((err <= per_elem_scale * (0.5 + 1e-5) + 1e-7).all()), float((err / per_elem_scale).max())
    assert bool((d[0] == 0).all())


def test_quantize_round_half_to_even():
    """Exact ties: w / scale = k + 0.5 rounds to the even neighbour, as torch.round."""
    w = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 3.0, 0.0]], device=DEVICE)
    q, scale, _ = quantize_int8(w)
    assert float(scale) == 1.0
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, 3, 0]]


@pytest.mark.parametrize("dtype", [F32])
def test_dequantize_output_dtype_and_channel_scale_as_vector(dtype):
    torch.manual_seed(5)
    w = _randn(6, 40)
    q, scale, zp = quantize_int8(w, mode="asymmetric")
    d = dequantize_int8(q, scale.squeeze(-1), zp.squeeze(-1), dtype=dtype)
    assert d.dtype == dtype
    assert torch.equal(d, dequantize_int8_reference(q, scale, zp))


def test_quantization_rejects_bad_inputs():
    w = _randn(4, 100)
    with pytest.raises(ValueError,
                       match=r"quantize_int8: the last dimension \(100\) must be divisible by group_size \(32\)"):
        quantize_int8(w, granularity="group", group_size=32)
    with pytest.raises(ValueError, match="quantize_int8.*float64"):
        quantize_int8(w.double())
    with pytest.raises(ValueError, match="quantize_int8: mode"):
        quantize_int8(w, mode="nf4")
    with pytest.raises(ValueError, match="quantize_int8: granularity"):
        quantize_int8(w, granularity="tensor")
    q, scale, zp = quantize_int8(_randn(4, 64), mode="asymmetric", granularity="group", group_size=32)
    with pytest.raises(ValueError, match="dequantize_int8: q must be an int8"):
        dequantize_int8(q.to(torch.int32), scale, zp)
    with pytest.raises(ValueError, match="dequantize_int8: scale must be a float32"):
        dequantize_int8(q, scale.double(), zp)
    with pytest.raises(ValueError, match="dequantize_int8: zero_point must be an int32"):
        dequantize_int8(q, scale, zp.long())
    with pytest.raises(ValueError, match="dequantize_int8: scale has 2 groups per row, expected 4"):
        dequantize_int8(q, scale, zp, group_size=16)
    with pytest.raises(ValueError, match="dequantize_int8: scale shape"):
        dequantize_int8(q, scale[:3], zp[:3])


# --------------------------------------------------------------------------------------------------
# int8 weight-only matmul
# --------------------------------------------------------------------------------------------------

MATMUL_CASES = [  # (x shape, N, granularity, group_size): K = x.shape[-1], never a multiple of 32 for channel
    ((17, 33), 37, "channel", None),
    ((1, 100), 45, "channel", None),
    ((2, 3, 70), 33, "channel", None),
    ((5, 96), 40, "group", 32),  # groups aligned to the K block
    ((7, 80), 19, "group", 16),  # groups smaller than the CPU K block: one group per block
    ((9, 72), 21, "group", 24),  # non-power-of-two groups: per-element scale gather
]


@pytest.mark.parametrize("mode", ["symmetric", "asymmetric"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("xshape,n,granularity,group_size", MATMUL_CASES,
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_int8_matmul_matches_reference(xshape, n, granularity, group_size, bias, mode, tolerance):
    torch.manual_seed(6)
    k = xshape[-1]
    x = _randn(*xshape)
    q, scale, zp = quantize_int8(_randn(n, k), mode=mode, granularity=granularity, group_size=group_size or 128)
    b = _randn(n) if bias else None
    y = int8_weight_only_matmul(x, q, scale, zp, b)
    ref = int8_weight_only_matmul_reference(x, q, scale, zp, b)
    assert y.shape == (*xshape[:-1], n) and y.dtype == x.dtype
    torch.testing.assert_close(y, ref, **tolerance("int8_weight_only_matmul", F32))


def test_int8_matmul_strided_x(tolerance):
    torch.manual_seed(7)
    x = _randn(11, 50)[:, :45]
    q, scale, _ = quantize_int8(_randn(23, 45))
    torch.testing.assert_close(int8_weight_only_matmul(x, q, scale.squeeze(-1)),
                               int8_weight_only_matmul_reference(x, q, scale),
                               **tolerance("int8_weight_only_matmul", F32))


def test_int8_matmul_rejects_bad_inputs():
    x = _randn(4, 64)
    q, scale, zp = quantize_int8(_randn(8, 64), mode="asymmetric")
    with pytest.raises(ValueError, match="int8_weight_only_matmul: x's last dimension must be K=64"):
        int8_weight_only_matmul(_randn(4, 63), q, scale, zp)
    with pytest.raises(ValueError, match="int8_weight_only_matmul.*float64"):
        int8_weight_only_matmul(x.double(), q, scale, zp)
    with pytest.raises(ValueError, match="int8_weight_only_matmul: q must be a 2-D int8"):
        int8_weight_only_matmul(x, q.float(), scale, zp)
    with pytest.raises(ValueError, match=r"int8_weight_only_matmul: bias must have shape \(8,\)"):
        int8_weight_only_matmul(x, q, scale, zp, _randn(7))
    with pytest.raises(ValueError, match=r"int8_weight_only_matmul: the last dimension \(64\) must be divisible"):
        int8_weight_only_matmul(x, q, scale, zp, group_size=48)
    with pytest.raises(ValueError, match="int8_weight_only_matmul: zero_point must be an int32"):
        int8_weight_only_matmul(x, q, scale, zp.float())


@pytest.mark.filterwarnings("default")
def test_ops_fall_back_to_reference_with_one_warning(fresh_fallback_warnings):
    """CPU bf16 cannot take the Triton path (interpreter: fp32 only; else: no CUDA tensor)."""
    if DEVICE == "cuda":
        pytest.skip("bf16 takes the Triton path on a GPU")
    w = torch.randn(8, 64).bfloat16()
    with pytest.warns(RuntimeWarning, match="quantize_int8"):
        q, scale, zp = quantize_int8(w)
    assert torch.equal(q, quantize_int8_reference(w)[0])
    with pytest.warns(RuntimeWarning, match="dequantize_int8"):
        dequantize_int8(q, scale, zp, dtype=BF16)
    x = torch.randn(3, 64).bfloat16()
    with pytest.warns(RuntimeWarning, match="int8_weight_only_matmul"):
        y = int8_weight_only_matmul(x, q, scale)
    torch.testing.assert_close(y, int8_weight_only_matmul_reference(x, q, scale))
    p = torch.zeros(5)
    with pytest.warns(RuntimeWarning, match="fused_adamw"):
        fused_adamw_step([p], [torch.ones(5).bfloat16()], [torch.zeros(5)], [torch.zeros(5)], 1, 0.1, 0.9, 0.999,
                         1e-8, 0.0)
    torch.testing.assert_close(p, torch.full((5,), -0.1))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_int8(w)  # warned once per op, not per call
        int8_weight_only_matmul(x, q, scale)


# --------------------------------------------------------------------------------------------------
# GPU tier: bf16 at real shapes
# --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_fused_adamw_bf16_model_copy_gpu(tolerance):
    """fp32 master (4096 x 4096 and a 50257-element vector) with bf16 model copies, bf16 grads."""
    torch.manual_seed(20)
    shapes = [(4096, 4096), (50257,)]
    ref, opt_ref, mine, opt = _torch_and_fused(shapes, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    copies = [torch.empty(s, dtype=BF16, device=DEVICE) for s in shapes]
    for m, c in zip(mine, copies):
        opt.link_model_param(m, c)
    for _ in range(3):
        for r, m in zip(ref, mine):
            g = _randn(*r.shape, dtype=BF16)
            r.grad = g.float()
            m.grad = g  # bf16 grads, upcast in the kernel
        opt_ref.step()
        opt.step()
    _assert_same_state(opt_ref, opt, ref, mine, tolerance("fused_adamw", F32))
    for m, c in zip(mine, copies):
        assert torch.equal(c, m.detach().to(BF16))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["symmetric", "asymmetric"])
@pytest.mark.parametrize("granularity,group_size", [("channel", None), ("group", 128)])
def test_quantize_bf16_gpu(mode, granularity, group_size):
    torch.manual_seed(21)
    w = _randn(4096, 11008, dtype=BF16, scale=0.02)
    kw = dict(mode=mode, granularity=granularity, group_size=group_size or 128)
    q, scale, zp = quantize_int8(w, **kw)
    rq, rscale, rzp = quantize_int8_reference(w, **kw)
    assert torch.equal(q, rq) and torch.equal(scale, rscale)
    assert (zp is None and rzp is None) or torch.equal(zp, rzp)
    d = dequantize_int8(q, scale, zp, dtype=BF16)
    torch.testing.assert_close(d, dequantize_int8_reference(q, scale, zp, dtype=BF16), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 2048])
@pytest.mark.parametrize("granularity,group_size", [("channel", None), ("group", 128)])
def test_int8_matmul_bf16_gpu(m, granularity, group_size, tolerance):
    torch.manual_seed(22)
    n, k = 11008, 4096
    x = _randn(m, k, dtype=BF16)
    q, scale, zp = quantize_int8(_randn(n, k, scale=0.02), mode="asymmetric", granularity=granularity,
                                 group_size=group_size or 128)
    b = _randn(n, dtype=BF16)
    y = int8_weight_only_matmul(x, q, scale, zp, b)
    ref = int8_weight_only_matmul_reference(x.float(), q, scale, zp, b.float())
    assert y.dtype == BF16
    torch.testing.assert_close(y.float(), ref, **tolerance("int8_weight_only_matmul", BF16))
