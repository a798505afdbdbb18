"""Fused MLP activations as Triton kernels, forward and backward: bias + GELU(tanh), and SwiGLU.

What:
  * `bias_gelu(x, bias)` = gelu(x + bias, approximate="tanh") (GPT-2's MLP after fc_in when the
    linear layer's bias is left out of the matmul), with gradients for x and bias.
  * `swiglu(gate, up)` = silu(gate) * up (Llama's MLP), with gradients for both; or `swiglu(x)` with
    x = cat(gate, up) along the last dim ([..., 2F], gate first), gradient in the same packed layout,
    which is what a single fused gate+up projection produces.

Why: unfused, each of these is 2-4 elementwise kernels with intermediates kept for autograd; fused,
the forward reads the inputs once and writes the output once, and the backward recomputes the
activation from the saved inputs (no intermediates saved). Math is fp32 in registers whatever the
storage dtype. The bias gradient is reduced across rows inside the backward kernel (per-program
fp32 partial sums, summed on the host).

tanh is built from exp, and the kernels use only 1 + tanh and 1 - tanh, computed from e = e^{-2|z|}
as 2/(1 + e) and 2e/(1 + e): overflow-free, available on every backend (the interpreter included), and
without the cancellation of 1 + tanh(z) and 1 - tanh(z)^2 where tanh(z) is near -1 (u of about -3 and
below), so the gradient there is accurate to a few ulp rather than to ~1e-6 absolute as in the
textbook form torch also uses.

Public: `bias_gelu`, `bias_gelu_reference`, `BiasGeluFunction`, `swiglu`, `swiglu_reference`,
`SwiGLUFunction`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dsrecipes.kernels._utils import (
    check_float_dtype,
    jit,
    next_power_of_2,
    reduction_programs,
    tl,
    triton,
    use_triton,
)

GELU_OP = "bias_gelu"
SWIGLU_OP = "swiglu"

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def _tile(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for a 2-D elementwise tile of about 4096 elements."""
    block_n = min(next_power_of_2(n_cols), 1024)
    block_m = max(1, 4096 // block_n)
    return block_m, block_n, 8


# --------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------


@jit
def _one_plus_minus_tanh(z):
    """(1 + tanh z, 1 - tanh z) from e = exp(-2|z|), with no cancellation where tanh z is near +-1.

    1 + |tanh z| = 2 / (1 + e) and 1 - |tanh z| = 2e / (1 + e); the sign of z says which is which.
    """
    e = tl.exp(-2.0 * tl.abs(z))
    big = 2.0 / (1.0 + e)
    small = e * big
    pos = z >= 0
    return tl.where(pos, big, small), tl.where(pos, small, big)


@jit
def _bias_gelu_fwd_kernel(
    X, B, Y, M, N, stride_x, stride_y,
    K0: tl.constexpr, K1: tl.constexpr, HAS_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """y = 0.5 u (1 + tanh(K0 (u + K1 u^3))), u = x + b, on a [BLOCK_M, BLOCK_N] tile."""
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    mask = (rows < M)[:, None] & cmask[None, :]
    u = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        u += tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    one_plus_t, _ = _one_plus_minus_tanh(K0 * (u + K1 * u * u * u))
    y = 0.5 * u * one_plus_t
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@jit
def _bias_gelu_bwd_kernel(
    X, B, DY, DX, DB_PART, M, N, stride_x, stride_dy, stride_dx,
    K0: tl.constexpr, K1: tl.constexpr, HAS_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dx = dy * gelu'(x + b); program (p, j) walks row tiles p, p + P, ... of column block j and
    writes its fp32 partial sum of dx (the bias grad) to DB_PART[p, block j].

    gelu'(u) = 0.5 (1 + t) + 0.5 u (1 + t)(1 - t) K0 (1 + 3 K1 u^2),  t = tanh(K0 (u + K1 u^3)).
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    if HAS_B:
        b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for tile in range(pid, tl.cdiv(M, BLOCK_M), nprog):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        mask = (rows < M)[:, None] & cmask[None, :]
        u = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            u += b[None, :]
        one_plus_t, one_minus_t = _one_plus_minus_tanh(K0 * (u + K1 * u * u * u))
        # 1 - t^2 as (1 + t)(1 - t): accurate where t is near -1 or 1
        dgelu = 0.5 * one_plus_t + 0.5 * u * (one_plus_t * one_minus_t) * K0 * (1.0 + 3.0 * K1 * u * u)
        dx = dy * dgelu
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_B:
            db_acc += tl.sum(tl.where(mask, dx, 0.0), axis=0)
    if HAS_B:
        tl.store(DB_PART + pid * N + cols, db_acc, mask=cmask)


@jit
def _swiglu_fwd_kernel(
    G, U, Y, M, N, stride_g, stride_u, stride_y,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """y = g * sigmoid(g) * u on a [BLOCK_M, BLOCK_N] tile (G and U may be halves of one tensor)."""
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    g = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows[:, None] * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@jit
def _swiglu_bwd_kernel(
    G, U, DY, DG, DU, M, N, stride_g, stride_u, stride_dy, stride_dg, stride_du,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dg = dy * u * sigmoid(g) (1 + g (1 - sigmoid(g))),  du = dy * silu(g)."""
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    g = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows[:, None] * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    silu = g * sig
    dg = dy * u * sig * (1.0 + g * (1.0 - sig))
    du = dy * silu
    tl.store(DG + rows[:, None] * stride_dg + cols[None, :], dg.to(DG.dtype.element_ty), mask=mask)
    tl.store(DU + rows[:, None] * stride_du + cols[None, :], du.to(DU.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------
# Host launchers and autograd Functions
# --------------------------------------------------------------------------------------------------


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., N] -> [M, N] with unit column stride (a view when possible)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _bias_gelu_fwd(x2, bias):
    M, N = x2.shape
    block_m, block_n, num_warps = _tile(N)
    y = torch.empty_like(x2)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _bias_gelu_fwd_kernel[grid](
        x2, bias if bias is not None else x2, y, M, N, x2.stride(0), y.stride(0),
        K0=_SQRT_2_OVER_PI, K1=_GELU_C, HAS_B=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=num_warps,
    )
    return y


def _bias_gelu_bwd(dy2, x2, bias):
    M, N = x2.shape
    block_m, block_n, num_warps = _tile(N)
    n_col_blocks = triton.cdiv(N, block_n)
    n_prog = reduction_programs(x2.device, triton.cdiv(M, block_m))
    if x2.is_cuda:  # keep the total program count near two per SM
        n_prog = max(1, n_prog // n_col_blocks)
    dx = torch.empty_like(x2)
    db_part = torch.empty((n_prog, N), dtype=torch.float32, device=x2.device) if bias is not None else None
    _bias_gelu_bwd_kernel[(n_prog, n_col_blocks)](
        x2, bias if bias is not None else x2, dy2, dx, db_part if db_part is not None else dx,
        M, N, x2.stride(0), dy2.stride(0), dx.stride(0),
        K0=_SQRT_2_OVER_PI, K1=_GELU_C, HAS_B=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=num_warps,
    )
    db = db_part.sum(0).to(bias.dtype) if bias is not None else None
    return dx, db


class BiasGeluFunction(torch.autograd.Function):
    """autograd wrapper: forward(x, bias) -> gelu_tanh(x + bias); saves x and bias only."""

    @staticmethod
    def forward(ctx, x, bias):
        x2 = _rows(x)
        y = _bias_gelu_fwd(x2, bias)
        ctx.save_for_backward(x2, bias)
        ctx.shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, bias = ctx.saved_tensors
        dx, db = _bias_gelu_bwd(_rows(dy), x2, bias)
        return dx.view(ctx.shape), db


def _swiglu_views(x2):
    """The gate and up halves of a packed [M, 2F] tensor, as [M, F] views."""
    f = x2.shape[-1] // 2
    return x2[:, :f], x2[:, f:]


def _swiglu_fwd(g2, u2):
    M, N = g2.shape
    block_m, block_n, num_warps = _tile(N)
    y = torch.empty((M, N), dtype=g2.dtype, device=g2.device)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _swiglu_fwd_kernel[grid](
        g2, u2, y, M, N, g2.stride(0), u2.stride(0), y.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
    )
    return y


def _swiglu_bwd(dy2, g2, u2, dg2, du2):
    M, N = g2.shape
    block_m, block_n, num_warps = _tile(N)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _swiglu_bwd_kernel[grid](
        g2, u2, dy2, dg2, du2, M, N, g2.stride(0), u2.stride(0), dy2.stride(0), dg2.stride(0), du2.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
    )


class SwiGLUFunction(torch.autograd.Function):
    """autograd wrapper: forward(gate, up) -> silu(gate) * up; with up=None, gate is cat(gate, up)."""

    @staticmethod
    def forward(ctx, gate, up):
        packed = up is None
        if packed:
            x2 = _rows(gate)
            g2, u2 = _swiglu_views(x2)
            out_shape = (*gate.shape[:-1], gate.shape[-1] // 2)
            ctx.save_for_backward(x2)
        else:
            g2, u2 = _rows(gate), _rows(up)
            out_shape = gate.shape
            ctx.save_for_backward(g2, u2)
        y = _swiglu_fwd(g2, u2)
        ctx.packed = packed
        ctx.in_shape = gate.shape
        return y.view(out_shape)

    @staticmethod
    def backward(ctx, dy):
        dy2 = _rows(dy)
        if ctx.packed:
            (x2,) = ctx.saved_tensors
            g2, u2 = _swiglu_views(x2)
            dx = torch.empty_like(x2)
            dg2, du2 = _swiglu_views(dx)
            _swiglu_bwd(dy2, g2, u2, dg2, du2)
            return dx.view(ctx.in_shape), None
        g2, u2 = ctx.saved_tensors
        dg2, du2 = torch.empty_like(g2), torch.empty_like(u2)
        _swiglu_bwd(dy2, g2, u2, dg2, du2)
        return dg2.view(ctx.in_shape), du2.view(ctx.in_shape)


# --------------------------------------------------------------------------------------------------
# References and public functions
# --------------------------------------------------------------------------------------------------


def bias_gelu_reference(x, bias=None):
    """Pure-torch gelu(x + bias, approximate="tanh") in fp32, returned in x's dtype."""
    u = x.float()
    if bias is not None:
        u = u + bias.float()
    return F.gelu(u, approximate="tanh").to(x.dtype)


def bias_gelu(x, bias=None):
    """Fused gelu(x + bias, approximate="tanh") over x [..., N] with bias [N] (or None).

    fp16/bf16/fp32 (fp32 only on CPU under the Triton interpreter); returns x's dtype; gradients
    flow to x and bias (the bias grad is in bias's dtype). ValueError on an unsupported dtype or a
    bias whose shape is not [N].
    """
    check_float_dtype(GELU_OP, x, bias)
    if x.dim() < 1:
        raise ValueError(f"{GELU_OP}: x must have at least one dimension, got a scalar")
    if bias is not None and tuple(bias.shape) != (x.shape[-1],):
        raise ValueError(f"{GELU_OP}: bias must have shape ({x.shape[-1]},) (the last dim of x), "
                         f"got {tuple(bias.shape)}")
    if x.numel() > 0 and use_triton(GELU_OP, _bias_gelu_fwd_kernel, x, bias):
        return BiasGeluFunction.apply(x, bias)
    return bias_gelu_reference(x, bias)


def swiglu_reference(gate, up=None):
    """Pure-torch silu(gate) * up in fp32, returned in gate's dtype; up=None splits gate in halves."""
    if up is None:
        gate, up = gate.chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


def swiglu(gate, up=None):
    """Fused SwiGLU: silu(gate) * up.

    Args:
        gate: [..., F]; or, with up=None, the packed [..., 2F] tensor cat(gate, up) (gate first).
        up: [..., F] like gate, same dtype, or None.
    Returns [..., F] in gate's dtype; gradients flow to gate and up (packed: one [..., 2F] grad).
    fp16/bf16/fp32 (fp32 only on CPU under the Triton interpreter). ValueError on an unsupported
    dtype, gate/up shape or dtype mismatch, or an odd packed last dim.
    """
    check_float_dtype(SWIGLU_OP, gate, up)
    if gate.dim() < 1:
        raise ValueError(f"{SWIGLU_OP}: gate must have at least one dimension, got a scalar")
    if up is None:
        if gate.shape[-1] % 2:
            raise ValueError(f"{SWIGLU_OP}: a packed [..., 2F] input needs an even last dim, got {gate.shape[-1]}")
    else:
        if up.shape != gate.shape:
            raise ValueError(f"{SWIGLU_OP}: gate and up must have the same shape, got {tuple(gate.shape)} "
                             f"and {tuple(up.shape)}")
        if up.dtype != gate.dtype:
            raise ValueError(f"{SWIGLU_OP}: gate and up must have the same dtype, got {gate.dtype} and {up.dtype}")
    if gate.numel() > 0 and use_triton(SWIGLU_OP, _swiglu_fwd_kernel, gate, up):
        return SwiGLUFunction.apply(gate, up)
    return swiglu_reference(gate, up)
