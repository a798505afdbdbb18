"""Fused RMSNorm (optionally with the residual add folded in) as Triton kernels, forward and backward.

What: y = x * rsqrt(mean(x^2) + eps) * weight over the last dimension (Llama's norm), for any
number of leading dimensions and any hidden size (the row is one power-of-two block, masked). With a
residual the kernel also writes s = x + residual, the input of the next residual branch, and
normalizes s as stored (rounded to the residual's dtype), exactly as `rms_norm_reference` does.

Why: one read of x (and residual) and one write of y (and s) in the forward, keeping only the
per-row 1/rms in fp32; the backward recomputes x_hat from it. All math is in fp32. The weight
gradient is reduced across rows in the backward kernel (per-program fp32 partial sums, then a small
sum on the host).

Public: `rms_norm` (Triton when it can run, else the reference with a one-time warning),
`rms_norm_reference`, `RMSNormFunction` and the module `FusedRMSNorm(dim, eps)` whose single
parameter `weight` matches dsrecipes.models.layers.RMSNorm and torch.nn.RMSNorm, so state dicts load
either way.
"""

from __future__ import annotations

import torch
from torch import nn

from dsrecipes.kernels._utils import (
    cdiv,
    check_float_dtype,
    check_max_cols,
    jit,
    reduction_programs,
    row_tile,
    tl,
    use_triton,
)

OP = "rms_norm"


# --------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------


@jit
def _rms_norm_fwd_kernel(
    X, R, W, Y, S, RSTD,
    M, N, stride_x, stride_r, stride_y, stride_s, eps,
    HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program normalizes BLOCK_M rows; each row is one BLOCK_N block (masked past N)."""
    pid = tl.program_id(0)
    rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(S.dtype.element_ty)
        tl.store(S + rows[:, None] * stride_s + cols[None, :], s, mask=mask)
        x = s.to(tl.float32)
    ms = tl.sum(x * x, axis=1) / N
    rstd = 1.0 / tl.sqrt(ms + eps)
    y = x * rstd[:, None]
    if HAS_W:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        y = y * w[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=rmask)


@jit
def _rms_norm_bwd_kernel(
    X, W, DY, DSO, DX, DR, RSTD, DW_PART,
    M, N, stride_x, stride_dy, stride_dso, stride_dx, stride_dr,
    HAS_DSO: tl.constexpr, STORE_DR: tl.constexpr, HAS_W: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program p handles row tiles p, p + P, ...; writes dx (and d residual) and one row of fp32
    partial sums of dy * x_hat (the weight grad).

    x_hat = x * rstd,  g = dy * w,  dx = rstd * (g - x_hat * mean(g * x_hat))  [+ grad of the sum].
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(pid, num_tiles, nprog):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        rmask = rows < M
        mask = rmask[:, None] & cmask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        xhat = x * rstd[:, None]
        if HAS_W:
            g = dy * w[None, :]
        else:
            g = dy
        c1 = tl.sum(g * xhat, axis=1) / N
        dx = (g - xhat * c1[:, None]) * rstd[:, None]
        if HAS_DSO:
            dx += tl.load(DSO + rows[:, None] * stride_dso + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if STORE_DR:
            tl.store(DR + rows[:, None] * stride_dr + cols[None, :], dx.to(DR.dtype.element_ty), mask=mask)
        if HAS_W:
            dw_acc += tl.sum(dy * xhat, axis=0)
    if HAS_W:
        tl.store(DW_PART + pid * N + cols, dw_acc, mask=cmask)


# --------------------------------------------------------------------------------------------------
# Host launchers
# --------------------------------------------------------------------------------------------------


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., N] -> [M, N] with unit column stride (a view when possible)."""
    if t.dim() == 2 and t.stride(-1) == 1:  # already rows: no reshape call on the hot path
        return t
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _rms_norm_fwd(x2, weight, eps, r2):
    """Launch the forward on [M, N] rows; returns y, s (None without residual), rstd."""
    M, N = x2.shape
    block_m, block_n, num_warps = row_tile(N)
    y = torch.empty_like(x2)
    s = torch.empty_like(r2) if r2 is not None else None
    rstd = torch.empty(M, dtype=torch.float32, device=x2.device)
    grid = (cdiv(M, block_m),)
    _rms_norm_fwd_kernel[grid](
        x2, r2 if r2 is not None else x2, weight if weight is not None else x2,
        y, s if s is not None else y, rstd,
        M, N, x2.stride(0), r2.stride(0) if r2 is not None else 0, y.stride(0), s.stride(0) if s is not None else 0,
        float(eps),
        HAS_RES=r2 is not None, HAS_W=weight is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
    )
    return y, s, rstd


def _rms_norm_bwd(dy2, dso2, x2, weight, rstd, x_dtype, r_dtype):
    """Launch the backward; returns dx, d_residual (None without residual), dweight."""
    M, N = x2.shape
    block_m, block_n, num_warps = row_tile(N)
    n_prog = reduction_programs(x2.device, cdiv(M, block_m))
    dx = torch.empty((M, N), dtype=x_dtype, device=x2.device)
    # Written by the kernel, not aliased to dx: x.grad and residual.grad must not share storage.
    dr = torch.empty((M, N), dtype=r_dtype, device=x2.device) if r_dtype is not None else None
    dw_part = torch.empty((n_prog, N), dtype=torch.float32, device=x2.device) if weight is not None else None
    _rms_norm_bwd_kernel[(n_prog,)](
        x2, weight if weight is not None else x2, dy2, dso2 if dso2 is not None else dy2, dx,
        dr if dr is not None else dx, rstd, dw_part if dw_part is not None else rstd,
        M, N, x2.stride(0), dy2.stride(0), dso2.stride(0) if dso2 is not None else 0, dx.stride(0),
        dr.stride(0) if dr is not None else 0,
        HAS_DSO=dso2 is not None, STORE_DR=dr is not None, HAS_W=weight is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
    )
    dw = None
    if weight is not None:
        dw = dw_part.sum(0)
        dw = dw if weight.dtype == torch.float32 else dw.to(weight.dtype)
    return dx, dr, dw


class RMSNormFunction(torch.autograd.Function):
    """autograd wrapper: forward(x, weight, residual, eps) -> y, or (y, x + residual)."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps):
        shape = x.shape
        x2 = _rows(x)
        r2 = _rows(residual) if residual is not None else None
        y, s, rstd = _rms_norm_fwd(x2, weight, eps, r2)
        ctx.save_for_backward(s if s is not None else x2, weight, rstd)
        ctx.x_dtype = x.dtype
        ctx.r_dtype = residual.dtype if residual is not None else None
        ctx.shape = shape
        ctx.set_materialize_grads(False)
        if s is None:
            return y.view(shape)
        return y.view(shape), s.view(shape)

    @staticmethod
    def backward(ctx, dy, ds_out=None):
        x2, weight, rstd = ctx.saved_tensors
        dy2 = _rows(dy) if dy is not None else torch.zeros_like(x2, dtype=ctx.x_dtype)
        dso2 = _rows(ds_out) if ds_out is not None else None
        dx, dr, dw = _rms_norm_bwd(dy2, dso2, x2, weight, rstd, ctx.x_dtype, ctx.r_dtype)
        dx = dx.view(ctx.shape)
        dr = dr.view(ctx.shape) if dr is not None else None
        return dx, dw, dr, None


# --------------------------------------------------------------------------------------------------
# Reference, public function, module
# --------------------------------------------------------------------------------------------------


def rms_norm_reference(x, weight=None, eps: float = 1e-5, residual=None):
    """Pure-torch RMSNorm with the same contract as `rms_norm` (fp32 math, output in x's dtype)."""
    h = x
    s = None
    if residual is not None:
        s = (x.float() + residual.float()).to(residual.dtype)
        h = s
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    y = y.to(x.dtype)
    return y if s is None else (y, s)


def _check(x, weight, residual):
    check_float_dtype(OP, x, weight, residual)
    if x.dim() < 1:
        raise ValueError(f"{OP}: x must have at least one dimension, got a scalar")
    n = x.shape[-1]
    if weight is not None and tuple(weight.shape) != (n,):
        raise ValueError(f"{OP}: weight must have shape ({n},) (the last dim of x), got {tuple(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"{OP}: residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    check_max_cols(OP, n)


def rms_norm(x, weight=None, eps: float = 1e-5, residual=None):
    """RMSNorm over the last dim of x, optionally of (x + residual).

    Args:
        x: [..., N] fp16/bf16/fp32 (fp32 only on CPU under the Triton interpreter).
        weight: [N] or None.
        eps: added to the mean square.
        residual: None or a tensor shaped like x (any supported dtype).
    Returns:
        y (x's dtype) without residual; with one, (y, s) where s = x + residual in residual's dtype
        and y = RMSNorm(s). Gradients flow to x, weight and residual.
    Raises:
        ValueError: unsupported dtype, mismatched shapes, or N > 65536.
    """
    _check(x, weight, residual)
    if x.numel() > 0 and use_triton(OP, _rms_norm_fwd_kernel, x, weight, residual):
        return RMSNormFunction.apply(x, weight, residual, eps)
    return rms_norm_reference(x, weight, eps, residual)


class FusedRMSNorm(nn.Module):
    """RMSNorm over the last dim on the fused kernels; `weight` only, like models.layers.RMSNorm.

    `forward(x)` returns y; `forward(x, residual)` returns (y, x + residual).
    """

    def __init__(self, dim: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def reset_parameters(self) -> None:
        """Weight to ones."""
        nn.init.ones_(self.weight)

    def forward(self, x, residual=None):
        """Normalize x (or x + residual, then also return that sum); see `rms_norm`."""
        return rms_norm(x, self.weight, self.eps, residual)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
