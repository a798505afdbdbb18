"""Causal / full flash attention (forward and backward) in Triton, with grouped-query attention.

Why: attention through `softmax(Q K^T) V` materialises a [T, T] score matrix per head; the flash
algorithm streams key/value blocks through an online softmax held in fp32 registers, so memory stays
O(T * D) per head and the scores never leave the chip. The forward saves only the output and the
per-row log-sum-exp; the backward recomputes the probabilities from them.

Layout: q [B, Hq, T, D], k and v [B, Hkv, T, D] with Hq % Hkv == 0. Query head h reads kv head
h // (Hq // Hkv) (the `repeat_interleave` convention), so with Hkv < Hq (GQA/MQA) each kv head serves
a group of query heads and its dk/dv sum over that group.

Kernels:
  * `_attn_fwd_kernel`      one program per (query block, batch*query head): online softmax over kv
                            blocks, writes O and the log-sum-exp (base 2, of the log2e-scaled scores).
  * `_attn_bwd_preprocess`  delta = rowsum(dO * O) per query row (fp32).
  * `_attn_bwd_dkdv_kernel` one program per (kv block, batch*kv head): loops over the group's query
                            heads and their query blocks, accumulating dk and dv in registers. No atomics:
                            each program owns its dk/dv rows outright.
  * `_attn_bwd_dq_kernel`   one program per (query block, batch*query head): loops over kv blocks.

Causal masking is top-left aligned (query i sees keys j <= i), the same as
`scaled_dot_product_attention(is_causal=True)` for equal query and key lengths. Any T works: rows and
columns past T are masked. Head dims: 16, 32, 64, 128.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dsrecipes.kernels._utils import check_float_dtype, jit, tl, triton, use_triton

__all__ = ["flash_attention", "flash_attention_reference", "FlashAttentionFunction", "SUPPORTED_HEAD_DIMS"]

_OP = "flash_attention"
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
_LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------


@jit
def _attn_fwd_kernel(
    Q, K, V, Out, LSE,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
    H, GROUP, T, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < T

    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M, T)
    else:
        hi = T
    # Key block 0 is visited first and key 0 is visible to every row (padded rows included), so
    # m_i is finite after the first iteration and no row ever computes (-inf) - (-inf).
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < T
        kt = tl.load(k_base + cols[None, :] * skt + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
        valid = col_ok[None, :]
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * svt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    acc = acc / l_i[:, None]
    tl.store(LSE + pid_bh * T + offs_m, m_i + tl.log2(l_i), mask=row_ok)
    tl.store(Out + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], acc.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


@jit
def _attn_bwd_preprocess(
    Out, DO, DELTA,
    sob, soh, sot, sdb, sdh, sdt,
    H, T,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < T
    o = tl.load(Out + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh * T + offs_m, delta, mask=row_ok)


@jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
    sdkb, sdkh, sdkt, sdvb, sdvh, sdvt,
    H, HKV, GROUP, T, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // HKV
    hk = pid_bh % HKV

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < T

    k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * skt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    if CAUSAL:
        lo = ((pid_n * BLOCK_N) // BLOCK_M) * BLOCK_M  # earlier query blocks cannot see this kv block
    else:
        lo = 0
    for g in range(0, GROUP):
        h = hk * GROUP + g
        q_base = Q + b * sqb + h * sqh
        do_base = DO + b * sdb + h * sdh
        row_base = (b * H + h) * T
        for start_m in range(lo, T, BLOCK_M):
            rows = start_m + offs_m0
            row_ok = rows < T
            q = tl.load(q_base + rows[:, None] * sqt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            do = tl.load(do_base + rows[:, None] * sdt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            lse = tl.load(LSE + row_base + rows, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + row_base + rows, mask=row_ok, other=0.0)
            # Transposed scores: [BLOCK_N keys, BLOCK_M queries].
            st = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
            valid = row_ok[None, :]
            if CAUSAL:
                valid = valid & (rows[None, :] >= offs_n[:, None])
            pt = tl.exp2(tl.where(valid, st, float("-inf")) - lse[None, :])
            dv += tl.dot(pt.to(do.dtype), do, input_precision=DOT_PRECISION)
            dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
            dst = pt * (dpt - delta[None, :])
            dk += tl.dot(dst.to(q.dtype), q, input_precision=DOT_PRECISION)

    dk = dk * sm_scale
    tl.store(DK + b * sdkb + hk * sdkh + offs_n[:, None] * sdkt + offs_d[None, :], dk.to(DK.dtype.element_ty),
             mask=col_ok[:, None])
    tl.store(DV + b * sdvb + hk * sdvh + offs_n[:, None] * sdvt + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=col_ok[:, None])


@jit
def _attn_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt, sdqb, sdqh, sdqt,
    H, GROUP, T, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < T

    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + pid_bh * T + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + pid_bh * T + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M, T)
    else:
        hi = T
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < T
        kt = tl.load(k_base + cols[None, :] * skt + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        vt = tl.load(v_base + cols[None, :] * svt + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
        valid = col_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        p = tl.exp2(tl.where(valid, s, float("-inf")) - lse[:, None])
        dp = tl.dot(do, vt, input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=DOT_PRECISION)

    dq = dq * sm_scale
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqt + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=row_ok[:, None])


# --------------------------------------------------------------------------------------------------
# Host launchers
# --------------------------------------------------------------------------------------------------


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    """The kernels index the head dim with stride 1; everything else may be strided."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs: exact fp32 products (no TF32) so fp32 matches the reference; ignored for 16-bit.
    return "ieee" if dtype == torch.float32 else "tf32"


def _fwd_config(q: torch.Tensor) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for the forward kernel."""
    d = q.shape[-1]
    if not q.is_cuda:  # interpreter: small blocks so tests exercise several blocks and masking
        return 16, 16, 1, 1
    if q.dtype == torch.float32:
        return 64, 32, 4, 2
    if d <= 64:
        return 128, 64, 4, 3
    return 128, 64, 8, 3


def _bwd_config(q: torch.Tensor) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for the two backward kernels."""
    d = q.shape[-1]
    if not q.is_cuda:
        return 16, 16, 1, 1
    if q.dtype == torch.float32:
        return 32, 32, 4, 2
    if d <= 64:
        return 64, 64, 4, 2
    return 64, 64, 8, 2


def _flash_fwd(q, k, v, causal: bool, sm_scale: float):
    """Launch the forward kernel: returns (o [B, Hq, T, D], lse [B, Hq, T] fp32, base-2 units)."""
    B, H, T, D = q.shape
    hkv = k.shape[1]
    o = torch.empty_like(q)
    lse = torch.empty((B, H, T), device=q.device, dtype=torch.float32)
    block_m, block_n, warps, stages = _fwd_config(q)
    grid = (triton.cdiv(T, block_m), B * H)
    _attn_fwd_kernel[grid](
        q, k, v, o, lse,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        H, H // hkv, T, sm_scale * _LOG2E,
        HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=warps, num_stages=stages,
    )
    return o, lse


def _flash_bwd(q, k, v, o, lse, do, causal: bool, sm_scale: float):
    """Launch preprocess, dk/dv and dq kernels: returns (dq, dk, dv) in the input dtypes."""
    B, H, T, D = q.shape
    hkv = k.shape[1]
    group = H // hkv
    block_m, block_n, warps, stages = _bwd_config(q)
    precision = _dot_precision(q.dtype)

    delta = torch.empty_like(lse)
    _attn_bwd_preprocess[(triton.cdiv(T, block_m), B * H)](
        o, do, delta, *_strides(o), *_strides(do), H, T, HEAD_DIM=D, BLOCK_M=block_m, num_warps=warps,
    )

    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    _attn_bwd_dkdv_kernel[(triton.cdiv(T, block_n), B * hkv)](
        q, k, v, do, lse, delta, dk, dv,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk), *_strides(dv),
        H, hkv, group, T, sm_scale * _LOG2E, sm_scale,
        HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, DOT_PRECISION=precision,
        num_warps=warps, num_stages=stages,
    )
    _attn_bwd_dq_kernel[(triton.cdiv(T, block_m), B * H)](
        q, k, v, do, lse, delta, dq,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
        H, group, T, sm_scale * _LOG2E, sm_scale,
        HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, DOT_PRECISION=precision,
        num_warps=warps, num_stages=stages,
    )
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: saves q, k, v, o and the log-sum-exp; the backward recomputes probabilities."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, sm_scale: float):
        q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
        o, lse = _flash_fwd(q, k, v, causal, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        ctx.sm_scale = sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _flash_bwd(q, k, v, o, lse, _unit_last(do), ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None


# --------------------------------------------------------------------------------------------------
# Reference and public entry point
# --------------------------------------------------------------------------------------------------


def flash_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, softmax_scale: float | None = None
) -> torch.Tensor:
    """Pure-torch attention: SDPA with k/v heads repeated (`repeat_interleave`) up to q's head count."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=softmax_scale)


def check_qkv_shapes(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q [B, Hq, T, D] and k, v [B, Hkv, T, D] with Hq a multiple of Hkv (shared by the attention ops)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{op}: q, k, v must be 4-D [B, H, T, D], got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"{op}: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    B, hq, T, D = q.shape
    if k.shape[0] != B or k.shape[2] != T or k.shape[3] != D:
        raise ValueError(f"{op}: k/v must be [B={B}, Hkv, T={T}, D={D}], got {tuple(k.shape)}")
    if k.shape[1] == 0 or hq % k.shape[1] != 0:
        raise ValueError(f"{op}: the query heads ({hq}) must be a multiple of the kv heads ({k.shape[1]})")


def check_qkv_dtypes(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """One supported floating dtype for q, k and v."""
    check_float_dtype(op, q, k, v)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{op}: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    check_qkv_shapes(_OP, q, k, v)
    D = q.shape[3]
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{_OP}: unsupported head dim {D}; supported head dims: {list(SUPPORTED_HEAD_DIMS)}")
    check_qkv_dtypes(_OP, q, k, v)


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, softmax_scale: float | None = None
) -> torch.Tensor:
    """Scaled dot-product attention with the flash algorithm; differentiable in q, k and v.

    Args:
        q: [B, Hq, T, D] queries.
        k, v: [B, Hkv, T, D] keys and values; Hq must be a multiple of Hkv (GQA when Hkv < Hq).
        causal: mask keys after each query (top-left aligned, as SDPA's `is_causal`).
        softmax_scale: multiplies q @ k^T before the softmax; default 1/sqrt(D).

    Returns:
        [B, Hq, T, D] in q's dtype. Runs the Triton kernels on CUDA tensors (fp16/bf16/fp32) or on CPU
        fp32 tensors under TRITON_INTERPRET=1; otherwise warns once and uses `flash_attention_reference`.

    Raises:
        ValueError: bad shapes, dtypes, or a head dim outside SUPPORTED_HEAD_DIMS (16, 32, 64, 128).
    """
    _check_inputs(q, k, v)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if q.shape[2] == 0 or q.shape[0] == 0 or q.shape[1] == 0:
        return flash_attention_reference(q, k, v, causal, scale)
    if not use_triton(_OP, _attn_fwd_kernel, q, k, v):
        return flash_attention_reference(q, k, v, causal, scale)
    return FlashAttentionFunction.apply(q, k, v, bool(causal), scale)
