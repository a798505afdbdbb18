"""Block-sparse attention (forward and backward) in Triton, with a pure-torch reference.

Why: with a block layout (dsrecipes.models.sparsity_config: fixed, bigbird, bslongformer, ...) a
query block attends to a handful of key blocks; the kernels visit *only those blocks*, so compute
and memory grow with the number of non-zero blocks (~linearly in T for a fixed window/global
pattern) instead of T^2. Same flash-style streaming as flash_attention.py: an online softmax in fp32
registers, the forward saves the output and the per-row log-sum-exp, the backward recomputes P.

Layout: q [B, Hq, T, D], k and v [B, Hkv, T, D] (Hq % Hkv == 0, query head h reads kv head
h // (Hq // Hkv)); layout Bool[Hq, T/block, T/block], True where query block i attends key block j.
With causal=True the layout is intersected with the block lower triangle and diagonal blocks get
the token-level j <= i mask, i.e. the result is softmax over (layout-expanded mask AND causal mask).
A query row that sees no key at all (an empty layout row) outputs zeros.

The layout is turned into two CSR indices on the host (`BlockSparseIndex`):
  * by rows: for each (head, query block), the key blocks it attends (forward and dq kernels);
  * by columns: for each (head, key block), the query blocks attending it (dk/dv kernel).
Kernels (tile = one layout block, so block must be 16, 32, 64 or 128 on the Triton path):
  * `_bs_fwd_kernel`   one program per (query block, batch*query head): loops over its key blocks.
  * flash_attention's `_attn_bwd_preprocess` delta = rowsum(dO * O), one program per query block.
  * `_bs_dkdv_kernel`  one program per (key block, batch*kv head): loops over the group's query heads
                       and the query blocks attending this key block; owns its dk/dv rows (no atomics).
  * `_bs_dq_kernel`    one program per (query block, batch*query head): loops over its key blocks.

Also `block_sparse_attention_gathered`: a pure-torch path that gathers only the attended key blocks
(padded to the longest layout row), so its memory and time are also ~linear in T. It is what the model
uses without a GPU; `block_sparse_attention_reference` (dense attention with the expanded mask,
O(T^2)) is the definition every path is tested against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dsrecipes.kernels._utils import jit, tl, use_triton, warn_fallback
from dsrecipes.kernels.flash_attention import (
    _attn_bwd_preprocess,
    _dot_precision,
    _strides,
    _unit_last,
    check_qkv_dtypes,
    check_qkv_shapes,
)

__all__ = [
    "block_sparse_attention",
    "block_sparse_attention_reference",
    "block_sparse_attention_gathered",
    "BlockSparseAttentionFunction",
    "BlockSparseIndex",
    "GatherPlan",
    "SUPPORTED_BLOCKS",
    "SUPPORTED_HEAD_DIMS",
]

_OP = "block_sparse_attention"
SUPPORTED_BLOCKS = (16, 32, 64, 128)
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
_LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------


@jit
def _bs_fwd_kernel(
    Q, K, V, Out, LSE, ROW_PTR, COL_IDX,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
    H, GROUP, T, NB, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP

    offs_m = pid_m * BLOCK + tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :])
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh

    m_i = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)

    start = tl.load(ROW_PTR + h * NB + pid_m)
    end = tl.load(ROW_PTR + h * NB + pid_m + 1)
    for idx in range(start, end):
        n = tl.load(COL_IDX + idx)
        cols = n * BLOCK + offs_n
        kt = tl.load(k_base + cols[None, :] * skt + offs_d[:, None])
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
        if CAUSAL:
            s = tl.where(cols[None, :] <= offs_m[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row whose first visited block is fully masked keeps m = -inf: shift by 0 instead of -inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * svt + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    empty = l_i == 0.0
    acc = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))  # exp2(s - inf) = 0 in bwd
    tl.store(LSE + pid_bh * T + offs_m, lse)
    tl.store(Out + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], acc.to(Out.dtype.element_ty))


@jit
def _bs_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, COLPTR, ROW_IDX,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
    sdkb, sdkh, sdkt, sdvb, sdvh, sdvt,
    H, HKV, GROUP, T, NB, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // HKV
    hk = pid_bh % HKV

    offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
    offs_m0 = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * skt + offs_d[None, :])
    v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svt + offs_d[None, :])
    dk = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)

    for g in range(0, GROUP):
        h = hk * GROUP + g
        q_base = Q + b * sqb + h * sqh
        do_base = DO + b * sdb + h * sdh
        row_base = (b * H + h) * T
        start = tl.load(COLPTR + h * NB + pid_n)
        end = tl.load(COLPTR + h * NB + pid_n + 1)
        for idx in range(start, end):
            m = tl.load(ROW_IDX + idx)
            rows = m * BLOCK + offs_m0
            q = tl.load(q_base + rows[:, None] * sqt + offs_d[None, :])
            do = tl.load(do_base + rows[:, None] * sdt + offs_d[None, :])
            lse = tl.load(LSE + row_base + rows)
            delta = tl.load(DELTA + row_base + rows)
            st = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale  # [keys, queries]
            if CAUSAL:
                st = tl.where(rows[None, :] >= offs_n[:, None], st, float("-inf"))
            pt = tl.exp2(st - lse[None, :])
            dv += tl.dot(pt.to(do.dtype), do, input_precision=DOT_PRECISION)
            dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
            dst = pt * (dpt - delta[None, :])
            dk += tl.dot(dst.to(q.dtype), q, input_precision=DOT_PRECISION)

    dk = dk * sm_scale
    tl.store(DK + b * sdkb + hk * sdkh + offs_n[:, None] * sdkt + offs_d[None, :], dk.to(DK.dtype.element_ty))
    tl.store(DV + b * sdvb + hk * sdvh + offs_n[:, None] * sdvt + offs_d[None, :], dv.to(DV.dtype.element_ty))


@jit
def _bs_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, ROW_PTR, COL_IDX,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt, sdqb, sdqh, sdqt,
    H, GROUP, T, NB, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP

    offs_m = pid_m * BLOCK + tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :])
    do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :])
    lse = tl.load(LSE + pid_bh * T + offs_m)
    delta = tl.load(DELTA + pid_bh * T + offs_m)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    dq = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)

    start = tl.load(ROW_PTR + h * NB + pid_m)
    end = tl.load(ROW_PTR + h * NB + pid_m + 1)
    for idx in range(start, end):
        n = tl.load(COL_IDX + idx)
        cols = n * BLOCK + offs_n
        kt = tl.load(k_base + cols[None, :] * skt + offs_d[:, None])
        vt = tl.load(v_base + cols[None, :] * svt + offs_d[:, None])
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
        if CAUSAL:
            s = tl.where(cols[None, :] <= offs_m[:, None], s, float("-inf"))
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, vt, input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=DOT_PRECISION)

    dq = dq * sm_scale
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqt + offs_d[None, :], dq.to(DQ.dtype.element_ty))


# --------------------------------------------------------------------------------------------------
# Layout index, host launchers, autograd
# --------------------------------------------------------------------------------------------------


@dataclass
class BlockSparseIndex:
    """CSR views of a [H, nb, nb] layout (after the causal cut): by rows for fwd/dq, by columns for dk/dv."""

    row_ptr: torch.Tensor  # int32 [H * nb + 1]
    col_idx: torch.Tensor  # int32 [nnz]: key blocks of (h, query block), in order
    col_ptr: torch.Tensor  # int32 [H * nb + 1]
    row_idx: torch.Tensor  # int32 [nnz]: query blocks attending (h, key block)
    num_blocks: int
    nnz: int

    @staticmethod
    def from_layout(layout: torch.Tensor, causal: bool, device=None) -> BlockSparseIndex:
        lay = layout.bool()
        if causal:
            lay = torch.tril(lay)
        nb = lay.shape[-1]

        def csr(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            counts = m.sum(-1).flatten()
            ptr = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=m.device)
            ptr[1:] = torch.cumsum(counts, 0)
            idx = m.nonzero()[:, 2]  # row-major over (h, row, col): grouped by (h, row), cols ascending
            return ptr.to(device=device, dtype=torch.int32), idx.to(device=device, dtype=torch.int32)

        row_ptr, col_idx = csr(lay)
        col_ptr, row_idx = csr(lay.transpose(1, 2))
        return BlockSparseIndex(row_ptr, col_idx, col_ptr, row_idx, nb, int(col_idx.numel()))


def _warps(block: int, d: int, is_cuda: bool) -> int:
    if not is_cuda:
        return 1
    return 8 if block * d >= 128 * 128 else 4


def _bs_fwd(q, k, v, index: BlockSparseIndex, block: int, causal: bool, sm_scale: float):
    B, H, T, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, H, T), device=q.device, dtype=torch.float32)
    _bs_fwd_kernel[(index.num_blocks, B * H)](
        q, k, v, o, lse, index.row_ptr, index.col_idx,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        H, H // k.shape[1], T, index.num_blocks, sm_scale * _LOG2E,
        HEAD_DIM=D, BLOCK=block, CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=_warps(block, D, q.is_cuda), num_stages=2 if q.is_cuda else 1,
    )
    return o, lse


def _bs_bwd(q, k, v, o, lse, do, index: BlockSparseIndex, block: int, causal: bool, sm_scale: float):
    B, H, T, D = q.shape
    hkv = k.shape[1]
    nb = index.num_blocks
    warps, stages, precision = _warps(block, D, q.is_cuda), 2 if q.is_cuda else 1, _dot_precision(q.dtype)
    delta = torch.empty_like(lse)
    _attn_bwd_preprocess[(nb, B * H)](o, do, delta, *_strides(o), *_strides(do), H, T, HEAD_DIM=D, BLOCK_M=block,
                                      num_warps=warps)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _bs_dkdv_kernel[(nb, B * hkv)](
        q, k, v, do, lse, delta, dk, dv, index.col_ptr, index.row_idx,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk), *_strides(dv),
        H, hkv, H // hkv, T, nb, sm_scale * _LOG2E, sm_scale,
        HEAD_DIM=D, BLOCK=block, CAUSAL=causal, DOT_PRECISION=precision, num_warps=warps, num_stages=stages,
    )
    _bs_dq_kernel[(nb, B * H)](
        q, k, v, do, lse, delta, dq, index.row_ptr, index.col_idx,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
        H, H // hkv, T, nb, sm_scale * _LOG2E, sm_scale,
        HEAD_DIM=D, BLOCK=block, CAUSAL=causal, DOT_PRECISION=precision, num_warps=warps, num_stages=stages,
    )
    return dq, dk, dv


class BlockSparseAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: saves q, k, v, o and the log-sum-exp; the layout index rides on ctx."""

    @staticmethod
    def forward(ctx, q, k, v, index: BlockSparseIndex, block: int, causal: bool, sm_scale: float):
        q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
        o, lse = _bs_fwd(q, k, v, index, block, causal, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.index, ctx.block, ctx.causal, ctx.sm_scale = index, block, causal, sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _bs_bwd(q, k, v, o, lse, _unit_last(do), ctx.index, ctx.block, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None, None, None


# --------------------------------------------------------------------------------------------------
# Pure-torch paths and the public entry point
# --------------------------------------------------------------------------------------------------


def _repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return k, v


def block_sparse_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: torch.Tensor, block: int,
    causal: bool = True, softmax_scale: float | None = None,
) -> torch.Tensor:
    """The definition: dense softmax(q k^T * scale) v over the expanded layout mask (AND causal); O(T^2).

    Rows that see no key output 0.
    """
    T = q.shape[2]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    k, v = _repeat_kv(q, k, v)
    mask = layout.bool().to(q.device).repeat_interleave(block, 1).repeat_interleave(block, 2)[:, :T, :T]
    if causal:
        mask = mask & torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.where(mask.any(-1, keepdim=True), probs, torch.zeros((), device=q.device))
    return torch.matmul(probs, v.float()).to(q.dtype)


@dataclass
class GatherPlan:
    """What the gathered path derives from a layout (cache it when the layout is reused across layers)."""

    kv_index: torch.Tensor  # int64 [H * nb * r]: flat (kv head, key block) of each gathered block
    keep: torch.Tensor  # bool [H, nb, block, r * block]: which gathered keys each query row sees
    seen: torch.Tensor  # bool [H, nb, block, 1]: rows that see at least one key
    r: int

    @staticmethod
    def from_layout(layout: torch.Tensor, block: int, causal: bool, num_kv_heads: int, device=None) -> GatherPlan:
        lay = layout.bool().to(device)
        if causal:
            lay = torch.tril(lay)
        H, nb, _ = lay.shape
        counts = lay.sum(-1)  # [H, nb]
        r = max(int(counts.max()), 1)
        # Each row's attended blocks first (a stable sort puts True before False); padding slots are masked.
        order = torch.sort((~lay).to(torch.int8), dim=-1, stable=True).indices[..., :r]  # [H, nb, r]
        valid = torch.arange(r, device=lay.device) < counts[..., None]
        kv_head = torch.arange(H, device=lay.device) // (H // num_kv_heads)
        kv_index = (kv_head[:, None, None] * nb + order).reshape(-1)
        keep = valid[:, :, None, :, None].expand(H, nb, block, r, block)
        if causal:
            arange = torch.arange(block, device=lay.device)
            q_pos = torch.arange(nb, device=lay.device)[:, None] * block + arange  # [nb, block]
            k_pos = order[..., None] * block + arange  # [H, nb, r, block]
            keep = keep & (k_pos[:, :, None] <= q_pos[None, :, :, None, None])
        keep = keep.reshape(H, nb, block, r * block).contiguous()
        return GatherPlan(kv_index, keep, keep.any(-1, keepdim=True), r)


def block_sparse_attention_gathered(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: torch.Tensor, block: int,
    causal: bool = True, softmax_scale: float | None = None, plan: GatherPlan | None = None,
) -> torch.Tensor:
    """Pure torch, ~linear in T: gathers each query block's key blocks (padded to the longest row).

    Memory is O(B * H * T * r * block) for r = the most key blocks any layout row has, instead of
    O(B * H * T^2). Differentiable through autograd (index_select's backward is an index_add).
    T must be a multiple of block; `plan` = a cached `GatherPlan.from_layout(...)`.
    """
    B, H, T, D = q.shape
    hkv, nb = k.shape[1], T // block
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    if plan is None:
        plan = GatherPlan.from_layout(layout, block, causal, hkv, device=q.device)
    r = plan.r
    kb = k.float().reshape(B, hkv * nb, block, D).index_select(1, plan.kv_index).view(B, H, nb, r * block, D)
    vb = v.float().reshape(B, hkv * nb, block, D).index_select(1, plan.kv_index).view(B, H, nb, r * block, D)
    qb = q.float().reshape(B, H, nb, block, D)
    scores = torch.matmul(qb, kb.transpose(-1, -2)) * scale  # [B, H, nb, block, r * block]
    probs = torch.softmax(scores.masked_fill(~plan.keep, float("-inf")), dim=-1)
    probs = torch.where(plan.seen, probs, torch.zeros((), device=q.device))
    return torch.matmul(probs, vb).reshape(B, H, T, D).to(q.dtype)


def _check_inputs(q, k, v, layout, block) -> None:
    check_qkv_shapes(_OP, q, k, v)
    hq, T = q.shape[1], q.shape[2]
    if block < 1 or T % block != 0:
        raise ValueError(f"{_OP}: the sequence length {T} must be a multiple of the layout block {block}")
    if tuple(layout.shape) != (hq, T // block, T // block):
        raise ValueError(f"{_OP}: layout must be [H={hq}, T/block={T // block}, T/block={T // block}], "
                         f"got {tuple(layout.shape)}")
    check_qkv_dtypes(_OP, q, k, v)


def block_sparse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: torch.Tensor, block: int,
    causal: bool = True, softmax_scale: float | None = None, index: BlockSparseIndex | None = None,
) -> torch.Tensor:
    """Attention restricted to a block layout; differentiable in q, k and v.

    Args:
        q: [B, Hq, T, D]; k, v: [B, Hkv, T, D] (GQA when Hkv < Hq); T a multiple of `block`.
        layout: Bool[Hq, T/block, T/block], True where query block i attends key block j.
        block: tokens per layout block side (16, 32, 64 or 128 on the Triton path).
        causal: also mask keys after each query (block lower triangle + within-block j <= i).
        softmax_scale: default 1/sqrt(D).
        index: a precomputed `BlockSparseIndex.from_layout(layout, causal, device)` (callers reusing
            one layout across layers pass it to skip rebuilding it).

    Runs the Triton kernels on CUDA tensors or CPU fp32 tensors under TRITON_INTERPRET=1 (when block
    and D are supported); otherwise warns once and uses `block_sparse_attention_reference`.
    """
    _check_inputs(q, k, v, layout, block)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if q.numel() == 0:
        return block_sparse_attention_reference(q, k, v, layout, block, causal, scale)
    if block not in SUPPORTED_BLOCKS or q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        warn_fallback(_OP, f"block {block} / head dim {q.shape[-1]} not in {SUPPORTED_BLOCKS} / {SUPPORTED_HEAD_DIMS}")
        return block_sparse_attention_reference(q, k, v, layout, block, causal, scale)
    if not use_triton(_OP, _bs_fwd_kernel, q, k, v):
        return block_sparse_attention_reference(q, k, v, layout, block, causal, scale)
    if index is None:
        index = BlockSparseIndex.from_layout(layout, causal, device=q.device)
    return BlockSparseAttentionFunction.apply(q, k, v, index, int(block), bool(causal), scale)
