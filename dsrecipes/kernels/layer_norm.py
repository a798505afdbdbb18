"""Fused LayerNorm (optionally with the residual add folded in) as Triton kernels, forward and backward.

What: y = LayerNorm(x [+ residual]) * weight + bias over the last dimension, for any number of
leading dimensions and any hidden size (the row is one power-of-two block, masked). With a residual
the kernel also writes the sum s = x + residual, which a pre-norm transformer feeds to the next
residual branch; the norm is taken of s as stored (rounded to the residual's dtype), so the pair
(y, s) is exactly what `layer_norm_reference` computes.

Why: the unfused version reads the activations three or four times (add, mean/var, normalize, affine)
and autograd keeps several intermediates; here the forward reads x (and residual) once and keeps
only the per-row mean and 1/std (fp32), and the backward recomputes x_hat from them. Statistics and
products are accumulated in fp32 whatever the input dtype. The weight and bias gradients are reduced
across rows inside the backward kernel: each program walks a strided set of row tiles, keeps fp32
partial sums and writes one row of partials; the host sums the few rows.

Public: `layer_norm` (Triton when it can run, else the reference with a one-time warning),
`layer_norm_reference`, `LayerNormFunction` and the module `FusedLayerNorm` whose parameters
(`weight`, `bias`) match torch.nn.LayerNorm's so state dicts load either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
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

OP = "layer_norm"


# --------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------


@jit
def _layer_norm_fwd_kernel(
    X, R, W, B, Y, S, MEAN, RSTD,
    M, N, stride_x, stride_r, stride_y, stride_s, eps,
    HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
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
        x = s.to(tl.float32)  # normalize the sum as stored, so forward and backward agree exactly
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    y = xc * rstd[:, None]
    if HAS_W:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        y = y * w[None, :]
    if HAS_B:
        b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
        y = y + b[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + rows, mean, mask=rmask)
    tl.store(RSTD + rows, rstd, mask=rmask)


@jit
def _layer_norm_bwd_kernel(
    X, W, DY, DSO, DX, DR, MEAN, RSTD, DW_PART, DB_PART,
    M, N, stride_x, stride_dy, stride_dso, stride_dx, stride_dr,
    HAS_DSO: tl.constexpr, STORE_DR: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program p handles row tiles p, p + P, p + 2P, ...; writes dx (and d residual) per row and one
    row of fp32 partial sums of dy * x_hat (weight grad) and dy (bias grad) for its tiles.

    x_hat = (x - mean) * rstd,  g = dy * w,
    dx = rstd * (g - x_hat * mean(g * x_hat) - mean(g))  [+ grad of the returned sum, if any].
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(pid, num_tiles, nprog):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        rmask = rows < M
        mask = rmask[:, None] & cmask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        if HAS_W:
            g = dy * w[None, :]
        else:
            g = dy
        c1 = tl.sum(g * xhat, axis=1) / N
        c2 = tl.sum(g, axis=1) / N
        dx = (g - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        if HAS_DSO:
            dx += tl.load(DSO + rows[:, None] * stride_dso + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if STORE_DR:
            tl.store(DR + rows[:, None] * stride_dr + cols[None, :], dx.to(DR.dtype.element_ty), mask=mask)
        if HAS_W:
            dw_acc += tl.sum(dy * xhat, axis=0)
        if HAS_B:
            db_acc += tl.sum(dy, axis=0)
    if HAS_W:
        tl.store(DW_PART + pid * N + cols, dw_acc, mask=cmask)
    if HAS_B:
        tl.store(DB_PART + pid * N + cols, db_acc, mask=cmask)


# --------------------------------------------------------------------------------------------------
# Host launchers
# --------------------------------------------------------------------------------------------------


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., N] -> [M, N] with unit column stride (a view when possible)."""
    if t.dim() == 2 and t.stride(-1) == 1:  # already rows: no reshape call on the hot path
        return t
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _layer_norm_fwd(x2, weight, bias, eps, r2):
    """Launch the forward on [M, N] rows; returns y, s (None without residual), mean, rstd."""
    M, N = x2.shape
    block_m, block_n, num_warps = row_tile(N)
    y = torch.empty_like(x2)
    s = torch.empty_like(r2) if r2 is not None else None
    mean, rstd = torch.empty((2, M), dtype=torch.float32, device=x2.device).unbind(0)  # one allocation
    grid = (cdiv(M, block_m),)
    _layer_norm_fwd_kernel[grid](
        x2, r2 if r2 is not None else x2, weight if weight is not None else x2, bias if bias is not None else x2,
        y, s if s is not None else y, mean, rstd,
        M, N, x2.stride(0), r2.stride(0) if r2 is not None else 0, y.stride(0), s.stride(0) if s is not None else 0,
        float(eps),
        HAS_RES=r2 is not None, HAS_W=weight is not None, HAS_B=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
    )
    return y, s, mean, rstd


def _layer_norm_bwd(dy2, dso2, x2, weight, has_bias, mean, rstd, x_dtype, r_dtype):
    """Launch the backward; returns dx, d_residual (None without residual), dweight, dbias."""
    M, N = x2.shape
    block_m, block_n, num_warps = row_tile(N)
    n_prog = reduction_programs(x2.device, cdiv(M, block_m))
    dx = torch.empty((M, N), dtype=x_dtype, device=x2.device)
    # Written by the kernel, not aliased to dx: x.grad and residual.grad must not share storage.
    dr = torch.empty((M, N), dtype=r_dtype, device=x2.device) if r_dtype is not None else None
    dw_part = torch.empty((n_prog, N), dtype=torch.float32, device=x2.device) if weight is not None else None
    db_part = torch.empty((n_prog, N), dtype=torch.float32, device=x2.device) if has_bias else None
    _layer_norm_bwd_kernel[(n_prog,)](
        x2, weight if weight is not None else x2, dy2, dso2 if dso2 is not None else dy2, dx,
        dr if dr is not None else dx, mean, rstd,
        dw_part if dw_part is not None else mean, db_part if db_part is not None else mean,
        M, N, x2.stride(0), dy2.stride(0), dso2.stride(0) if dso2 is not None else 0, dx.stride(0),
        dr.stride(0) if dr is not None else 0,
        HAS_DSO=dso2 is not None, STORE_DR=dr is not None, HAS_W=weight is not None, HAS_B=has_bias,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
    )
    dw = None
    if weight is not None:
        dw = dw_part.sum(0)
        dw = dw if weight.dtype == torch.float32 else dw.to(weight.dtype)
    db = db_part.sum(0) if has_bias else None
    return dx, dr, dw, db


class LayerNormFunction(torch.autograd.Function):
    """autograd wrapper: forward(x, weight, bias, residual, eps) -> y, or (y, x + residual)."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, eps):
        shape = x.shape
        x2 = _rows(x)
        r2 = _rows(residual) if residual is not None else None
        y, s, mean, rstd = _layer_norm_fwd(x2, weight, bias, eps, r2)
        ctx.save_for_backward(s if s is not None else x2, weight, mean, rstd)
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.x_dtype = x.dtype
        ctx.r_dtype = residual.dtype if residual is not None else None
        ctx.shape = shape
        ctx.set_materialize_grads(False)
        if s is None:
            return y.view(shape)
        return y.view(shape), s.view(shape)

    @staticmethod
    def backward(ctx, dy, ds_out=None):
        x2, weight, mean, rstd = ctx.saved_tensors
        dy2 = _rows(dy) if dy is not None else torch.zeros_like(x2, dtype=ctx.x_dtype)
        dso2 = _rows(ds_out) if ds_out is not None else None
        dx, dr, dw, db = _layer_norm_bwd(dy2, dso2, x2, weight, ctx.has_bias, mean, rstd, ctx.x_dtype, ctx.r_dtype)
        if db is not None and ctx.bias_dtype != torch.float32:
            db = db.to(ctx.bias_dtype)
        dx = dx.view(ctx.shape)
        dr = dr.view(ctx.shape) if dr is not None else None
        return dx, dw, db, dr, None


# --------------------------------------------------------------------------------------------------
# Reference, public function, module
# --------------------------------------------------------------------------------------------------


def layer_norm_reference(x, weight=None, bias=None, eps: float = 1e-5, residual=None):
    """Pure-torch LayerNorm with the same contract as `layer_norm` (fp32 math, output in x's dtype)."""
    h = x
    s = None
    if residual is not None:
        s = (x.float() + residual.float()).to(residual.dtype)
        h = s
    y = F.layer_norm(h.float(), (x.shape[-1],), weight.float() if weight is not None else None,
                     bias.float() if bias is not None else None, eps).to(x.dtype)
    return y if s is None else (y, s)


def _check(x, weight, bias, residual):
    check_float_dtype(OP, x, weight, bias, residual)
    if x.dim() < 1:
        raise ValueError(f"{OP}: x must have at least one dimension, got a scalar")
    n = x.shape[-1]
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != (n,):
            raise ValueError(f"{OP}: {name} must have shape ({n},) (the last dim of x), got {tuple(p.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"{OP}: residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    check_max_cols(OP, n)


def layer_norm(x, weight=None, bias=None, eps: float = 1e-5, residual=None):
    """LayerNorm over the last dim of x, optionally of (x + residual).

    Args:
        x: [..., N] fp16/bf16/fp32 (fp32 only on CPU under the Triton interpreter).
        weight, bias: [N] or None.
        eps: added to the variance.
        residual: None or a tensor shaped like x (any supported dtype).
    Returns:
        y (x's dtype) without residual; with one, (y, s) where s = x + residual in residual's dtype
        and y = LayerNorm(s). Gradients flow to x, weight, bias and residual.
    Raises:
        ValueError: unsupported dtype, mismatched shapes, or N > 65536.
    """
    _check(x, weight, bias, residual)
    if x.numel() > 0 and use_triton(OP, _layer_norm_fwd_kernel, x, weight, bias, residual):
        return LayerNormFunction.apply(x, weight, bias, residual, eps)
    return layer_norm_reference(x, weight, bias, eps, residual)


class FusedLayerNorm(nn.Module):
    """Drop-in for torch.nn.LayerNorm(dim, eps, bias=...) over the last dim, on the fused kernels.

    `forward(x)` returns y; `forward(x, residual)` returns (y, x + residual). State dicts are
    interchangeable with torch.nn.LayerNorm's (`weight`, and `bias` unless bias=False).
    """

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = (dim,)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        if bias:
            self.bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        """Weight to ones, bias to zeros (as torch.nn.LayerNorm)."""
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x, residual=None):
        """Normalize x (or x + residual, then also return that sum); see `layer_norm`."""
        return layer_norm(x, self.weight, self.bias, self.eps, residual)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape[0]}, eps={self.eps}, bias={self.bias is not None}"
