"""Weight-only int8 matmul as a Triton kernel: y = x @ dequant(q).T (+ bias), dequantizing in the kernel.

What: x [..., K] (fp32/bf16/fp16) times an int8 weight q [N, K] quantized per output channel or per
group of `group_size` along K, with the layout `quantize_int8` returns: scale fp32 [N, K / group_size]
(per channel: [N, 1] or [N]) and an optional int32 zero_point of the same shape. Forward only
(inference); output in x's dtype, bias [N] optional.

Why: the weight stays int8 in memory (half of bf16's bytes, the win for memory-bound decoding); each
[BLOCK_N, BLOCK_K] tile is loaded as int8, shifted by its zero point, scaled and cast to x's dtype
in registers, then fed to tl.dot with an fp32 accumulator. When the K block lies inside one group
(group_size a multiple of BLOCK_K, or a single group per row) the tile's scales are one [BLOCK_N]
vector; otherwise they are gathered per element.

Precision: fp32 x uses IEEE fp32 dot products (no TF32); bf16/fp16 x sees the dequantized weight
rounded to its dtype once before the dot, as a bf16 model computed from dequantized weights would.

Public: `int8_weight_only_matmul` (Triton when it can run, else the reference with a one-time
warning) and `int8_weight_only_matmul_reference` (dequantize in fp32, then torch matmul).
"""

from __future__ import annotations

import torch

from dsrecipes.kernels._utils import GPU_DTYPES, check_float_dtype, jit, tl, triton, use_triton
from dsrecipes.kernels.quantization import _check_dequantize, dequantize_int8_reference

OP = "int8_weight_only_matmul"


# --------------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------------


@jit
def _int8_wo_matmul_kernel(
    X, Q, S, Z, B, Y,
    M, N, K, GS, NG,
    stride_xm, stride_qn, stride_ym,
    HAS_ZP: tl.constexpr, HAS_BIAS: tl.constexpr, GROUP_ALIGNED: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One program computes a [BLOCK_M, BLOCK_N] tile of y, looping over K in BLOCK_K steps (masked tail)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    mmask = rm < M
    nmask = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        kmask = ks < K
        x = tl.load(X + rm[:, None] * stride_xm + ks[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        wmask = nmask[:, None] & kmask[None, :]
        q = tl.load(Q + rn[:, None] * stride_qn + ks[None, :], mask=wmask, other=0).to(tl.int32)
        if GROUP_ALIGNED:
            g = k0 // GS
            s = tl.load(S + rn * NG + g, mask=nmask, other=0.0)
            if HAS_ZP:
                q = q - tl.load(Z + rn * NG + g, mask=nmask, other=0)[:, None]
            w = q.to(tl.float32) * s[:, None]
        else:
            gidx = rn[:, None] * NG + (ks // GS)[None, :]
            s = tl.load(S + gidx, mask=wmask, other=0.0)
            if HAS_ZP:
                q = q - tl.load(Z + gidx, mask=wmask, other=0)
            w = q.to(tl.float32) * s
        w = w.to(X.dtype.element_ty)
        if IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    if HAS_BIAS:
        acc += tl.load(B + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rm[:, None] * stride_ym + rn[None, :], acc.to(Y.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------


def _check(x, q, scale, zero_point, bias, group_size):
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{OP}: x must be a tensor")
    check_float_dtype(OP, x, bias, allowed=GPU_DTYPES)
    if not isinstance(q, torch.Tensor) or q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"{OP}: q must be a 2-D int8 tensor [N, K], got "
                         f"{getattr(q, 'dtype', type(q))} {tuple(getattr(q, 'shape', ()))}")
    n, k = q.shape
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{OP}: x's last dimension must be K={k} (q is [{n}, {k}]), got x {tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"{OP}: bias must have shape ({n},), got {tuple(bias.shape)}")
    scale, zero_point, gs = _check_dequantize(q, scale, zero_point, group_size, x.dtype, op=OP)
    return scale, zero_point, gs


def int8_weight_only_matmul_reference(x, q, scale, zero_point=None, bias=None, group_size=None):
    """Dequantize q in fp32, then y = x @ w.T (+ bias) in fp32; returned in x's dtype."""
    scale, zero_point, gs = _check(x, q, scale, zero_point, bias, group_size)
    w = dequantize_int8_reference(q, scale, zero_point, gs, torch.float32)
    y = x.float() @ w.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def _tiles(x2, gs):
    if x2.is_cuda:
        bm = 16 if x2.shape[0] <= 16 else (64 if x2.shape[0] <= 64 else 128)
        bn, bk, warps, stages = 64, 64, 4, 3
    else:  # interpreter: few, wide programs
        bm, bn, bk, warps, stages = 32, 32, 32, 1, 1
    if gs % bk != 0 and gs < bk and gs >= 16 and (gs & (gs - 1)) == 0:
        bk = gs  # power-of-two groups smaller than the block: one group per K block
    return bm, bn, bk, warps, stages


def int8_weight_only_matmul(x, q, scale, zero_point=None, bias=None, group_size=None):
    """y = x @ ((q - zero_point) * scale).T + bias with q int8 [N, K], dequantized inside the kernel.

    Args:
        x: [..., K] fp32/bf16/fp16 (fp32 only on CPU under the Triton interpreter).
        q: int8 [N, K]; scale: fp32 [N, K // group_size] (per channel [N, 1] or [N]);
        zero_point: None (symmetric) or int32 shaped like scale; bias: [N] or None.
        group_size: defaults to K // scale.shape[-1].
    Returns:
        y [..., N] in x's dtype.
    Raises:
        ValueError: bad dtypes, mismatched shapes, K not divisible by group_size.
    """
    scale, zero_point, gs = _check(x, q, scale, zero_point, bias, group_size)
    n, k = q.shape
    if x.numel() == 0 or n == 0 or not use_triton(OP, _int8_wo_matmul_kernel, x, q, scale, zero_point, bias):
        return int8_weight_only_matmul_reference(x, q, scale, zero_point, bias, gs)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    qc = q if q.stride(-1) == 1 else q.contiguous()
    sc = scale.contiguous()
    zc = zero_point.contiguous() if zero_point is not None else None
    bc = bias.contiguous() if bias is not None else None
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    bm, bn, bk, warps, stages = _tiles(x2, gs)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _int8_wo_matmul_kernel[grid](
        x2, qc, sc, zc if zc is not None else sc, bc if bc is not None else sc, y,
        m, n, k, gs, sc.shape[-1],
        x2.stride(0), qc.stride(0), y.stride(0),
        HAS_ZP=zc is not None, HAS_BIAS=bc is not None,
        GROUP_ALIGNED=gs % bk == 0 or sc.shape[-1] == 1,  # per channel: one group per row
        IEEE=x.dtype == torch.float32,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
    )
    return y.reshape(*lead, n)
