"""Decode attention: one new query token per row against the KV cache, as a Triton kernel.

    y = decode_attention(q, k_cache, v_cache, start)   # q [B, H, 1, D]; k/v [B, Hkv, S, D]; start [B]
    y = decode_attention(q, k_cache, v_cache, start, end)   # end: a [1] long tensor, slots [start, end)

What: for each (row b, head h) the query attends to key slots [start[b], S) of its kv head
(h // (H / Hkv): grouped-query attention without repeating k/v), softmax scaled by 1/sqrt(D).
Slots before start[b] are the row's left padding. `end` (on the device) limits the slots read to
[start[b], end) without a host value, so a CUDA graph of the decode step replays at every length
(dsrecipes.inference.cuda_graphs). Why a kernel: at decode time attention is a
memory-bound read of the cache; SDPA with a boolean mask materialises the mask and (for GQA)
repeats k/v, while this kernel streams each kv head's slots once per query head with an online
softmax in fp32 (one program per row and head, BLOCK_N slots per step).

It reads the cache in place through its strides (the cache is a view of a larger preallocated
buffer), so only the last dim must be contiguous. Triton runs on CUDA tensors, or CPU fp32 tensors
under TRITON_INTERPRET=1; otherwise (and for other shapes) `decode_attention_reference` runs with a
one-time warning. Forward only. Not split along S (flash-decoding), so very long contexts at
batch 1 use B*H programs only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dsrecipes.kernels._utils import check_float_dtype, jit, next_power_of_2, tl, use_triton

OP = "decode_attention"


@jit
def _decode_attention_kernel(
    Q, K, V, START, END, Out,
    H, GROUP, scale,
    sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    kvh = h // GROUP
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    q = tl.load(Q + b * sq_b + h * sq_h + d, mask=dmask, other=0.0).to(tl.float32)
    start = tl.load(START + b)
    S = tl.load(END)
    m = tl.full((1,), -1.0e30, tl.float32)
    denom = tl.zeros((1,), tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for n0 in range(start, S, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < S
        tile_mask = nmask[:, None] & dmask[None, :]
        k = tl.load(K + b * sk_b + kvh * sk_h + n[:, None] * sk_s + d[None, :], mask=tile_mask, other=0.0)
        scores = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale
        scores = tl.where(nmask, scores, -1.0e30)
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new)
        p = tl.where(nmask, p, 0.0)
        v = tl.load(V + b * sv_b + kvh * sv_h + n[:, None] * sv_s + d[None, :], mask=tile_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        denom = denom * alpha + tl.sum(p, axis=0)
        m = m_new
    out = acc / denom
    tl.store(Out + b * so_b + h * so_h + d, out.to(Out.dtype.element_ty), mask=dmask)


def decode_attention_reference(q, k, v, start, end: torch.Tensor | None = None):
    """SDPA over slots [start[b], end) of each row (end: all S slots when None); GQA via enable_gqa."""
    slots = torch.arange(k.shape[2], device=k.device)
    visible = slots[None, :] >= start[:, None]
    if end is not None:
        visible = visible & (slots[None, :] < end)
    mask = visible[:, None, None, :]  # [B, 1, 1, S]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def _check(q, k, v, start, end):
    if q.dim() != 4 or q.shape[2] != 1:
        raise ValueError(f"{OP}: q must be [B, H, 1, D], got {tuple(q.shape)}")
    if k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"{OP}: k and v must both be [B, Hkv, S, D], got {tuple(k.shape)} and {tuple(v.shape)}")
    b, h, _, d = q.shape
    if k.shape[0] != b or k.shape[3] != d or k.shape[1] == 0 or h % k.shape[1]:
        raise ValueError(f"{OP}: k/v {tuple(k.shape)} do not fit q {tuple(q.shape)} (same B and D, H a multiple of Hkv)")
    if start.shape != (b,) or start.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{OP}: start must be an integer tensor of shape ({b},), got {start.dtype} {tuple(start.shape)}")
    if end is not None and (end.shape != (1,) or end.dtype != torch.int64):
        raise ValueError(f"{OP}: end must be a long tensor of shape (1,), got {end.dtype} {tuple(end.shape)}")
    check_float_dtype(OP, q, k, v)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor,
                     end: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one query per row over cache slots [start[b], end) (end: S when None); returns
    [B, H, 1, D] in q's dtype."""
    _check(q, k, v, start, end)
    if k.stride(-1) != 1 or v.stride(-1) != 1 or q.stride(-1) != 1 or k.shape[2] == 0:
        return decode_attention_reference(q, k, v, start, end)
    if not use_triton(OP, _decode_attention_kernel, q, k, v):
        return decode_attention_reference(q, k, v, start, end)
    b, h, _, d = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if end is None:
        end = torch.full((1,), k.shape[2], dtype=torch.long, device=k.device)
    block_n = 64 if q.is_cuda else 32
    _decode_attention_kernel[(b * h,)](
        q, k, v, start.contiguous(), end, out,
        h, h // k.shape[1], 1.0 / math.sqrt(d),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1),
        D=d, BLOCK_D=next_power_of_2(d), BLOCK_N=block_n,
        num_warps=4 if q.is_cuda else 1,
    )
    return out
