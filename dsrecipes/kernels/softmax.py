"""Row softmax over the last dimension, with an optional causal mask, as Triton kernels (fwd + bwd).

What: y = softmax(x, dim=-1). With causal=True, x is a [..., T, T] score tensor (query i along the
second-to-last dim, key j along the last) and keys j > i are masked out (probability exactly 0), the
mask attention uses for autoregressive models. The mask is generated in the kernel from the row
index, so no [T, T] mask tensor is read.

Why: one read of x and one write of y in the forward (max, exp, sum and normalize in registers, fp32),
and one read of y and dy, one write of dx in the backward: dx = y * (dy - sum(y * dy)), which needs
only the saved output (masked entries have y = 0, so their gradient is 0 with no extra masking).
Each row is one power-of-two block (masked past the last column); narrow rows are packed several
to a program.

Public: `softmax(x, causal=False)`, `softmax_reference`, `SoftmaxFunction`.
"""

from __future__ import annotations

import torch

from dsrecipes.kernels._utils import check_float_dtype, check_max_cols, jit, row_tile, tl, triton, use_triton

OP = "softmax"


@jit
def _softmax_fwd_kernel(
    X, Y, M, N, T_Q, stride_x, stride_y,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Softmax of BLOCK_M rows; with CAUSAL, row r is query r % T_Q and keys past it are masked."""
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols < N)[None, :]
    keep = mask
    if CAUSAL:
        q = rows % T_Q
        keep = keep & (cols[None, :] <= q[:, None])
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=keep, other=float("-inf")).to(tl.float32)
    mx = tl.max(x, axis=1)
    mx = tl.where(rmask, mx, 0.0)  # padding rows past M are all -inf: avoid -inf - -inf
    e = tl.exp(x - mx[:, None])
    e = tl.where(keep, e, 0.0)
    denom = tl.sum(e, axis=1)
    denom = tl.where(rmask, denom, 1.0)
    y = e / denom[:, None]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@jit
def _softmax_bwd_kernel(
    Y, DY, DX, M, N, stride_y, stride_dy, stride_dx,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dx = y * (dy - sum_j(y_j dy_j)) for BLOCK_M rows (masked keys have y = 0, hence dx = 0)."""
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    y = tl.load(Y + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(y * dy, axis=1)
    dx = y * (dy - dot[:, None])
    tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., N] -> [M, N] with unit column stride (a view when possible)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _softmax_fwd(x2, t_q: int, causal: bool):
    M, N = x2.shape
    block_m, block_n, num_warps = row_tile(N)
    y = torch.empty_like(x2)
    _softmax_fwd_kernel[(triton.cdiv(M, block_m),)](
        x2, y, M, N, t_q, x2.stride(0), y.stride(0),
        CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
    )
    return y


def _softmax_bwd(dy2, y2):
    M, N = y2.shape
    block_m, block_n, num_warps = row_tile(N)
    dx = torch.empty_like(y2)
    _softmax_bwd_kernel[(triton.cdiv(M, block_m),)](
        y2, dy2, dx, M, N, y2.stride(0), dy2.stride(0), dx.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
    )
    return dx


class SoftmaxFunction(torch.autograd.Function):
    """autograd wrapper: forward(x, causal) -> softmax over the last dim; saves only the output."""

    @staticmethod
    def forward(ctx, x, causal):
        t_q = x.shape[-2] if x.dim() >= 2 else 1
        y2 = _softmax_fwd(_rows(x), t_q, causal)
        ctx.save_for_backward(y2)
        ctx.shape = x.shape
        return y2.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        (y2,) = ctx.saved_tensors
        return _softmax_bwd(_rows(dy), y2).view(ctx.shape), None


def softmax_reference(x, causal: bool = False):
    """Pure-torch softmax over the last dim in fp32 (causal: keys j > query i masked), in x's dtype."""
    xf = x.float()
    if causal:
        t = x.shape[-1]
        masked = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        xf = xf.masked_fill(masked, float("-inf"))
    return torch.softmax(xf, dim=-1).to(x.dtype)


def softmax(x, causal: bool = False):
    """Softmax over the last dim of x; with causal=True x is [..., T, T] scores and keys j > i get 0.

    fp16/bf16/fp32 (fp32 only on CPU under the Triton interpreter); returns x's dtype; gradient to x.
    ValueError on an unsupported dtype, a last dim > 65536, or causal with non-square last two dims.
    """
    check_float_dtype(OP, x)
    if x.dim() < 1:
        raise ValueError(f"{OP}: x must have at least one dimension, got a scalar")
    if causal and (x.dim() < 2 or x.shape[-1] != x.shape[-2]):
        raise ValueError(f"{OP}: causal=True needs square [..., T, T] scores, got shape {tuple(x.shape)}")
    check_max_cols(OP, x.shape[-1])
    if x.numel() > 0 and use_triton(OP, _softmax_fwd_kernel, x):
        return SoftmaxFunction.apply(x, bool(causal))
    return softmax_reference(x, causal)
