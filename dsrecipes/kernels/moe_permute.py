"""MoE token permute / unpermute as Triton row-gather kernels, forward and backward.

What:
* permute_rows(tokens [S, M], source [P], slots [S, K]) -> [P, M]: out[p] = tokens[source[p]]
  (zero where source[p] is out of range: an empty capacity slot). Backward: each token sums the
  gradients of its K slots (a gather-sum over `slots`).
* unpermute_rows(y [P, M], slots [S, K], weight [S, K], source [P]) -> [S, M]:
  out[s] = sum_k weight[s, k] * y[slots[s, k]] accumulated in fp32 (dropped routes, slot out of
  range, contribute nothing). Backward: dy[p] = dout[source[p]] * weight of the route in slot p (a
  scaled row gather), `dweight[s, k] = <dout[s], y[slots[s, k]]>`.

Out-of-range indices (>= the gathered tensor's rows, or negative) mean "nothing", which is how
dsrecipes.models.moe_dispatch marks empty slots (source = S) and dropped routes (slot = E * C).

Why: the dispatch and combine of an MoE layer are pure data movement; as index_select + multiply +
sum in torch the combine materialises [S, K, M] and makes three passes. The gather-sum kernel reads
each routed row once and writes each token once; the row gather moves each row once.

Public: `permute_rows`, `unpermute_rows` (Triton when it can run, else the torch reference with a
one-time warning), `permute_rows_reference`, `unpermute_rows_reference`.
"""

from __future__ import annotations

import torch

from dsrecipes.kernels._utils import check_float_dtype, jit, next_power_of_2, tl, triton, use_triton

OP = "moe_permute"
BLOCK_COLS = 1024


@jit
def _gather_rows_kernel(src_ptr, index_ptr, scale_ptr, out_ptr, n_src, n_cols, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < n_cols
    idx = tl.load(index_ptr + row).to(tl.int64)
    valid = (idx >= 0) & (idx < n_src)
    safe = tl.where(valid, idx, 0)  # read a real row, then zero it: out-of-range means "nothing"
    values = tl.load(src_ptr + safe * n_cols + cols, mask=in_row, other=0.0).to(tl.float32)
    values = tl.where(valid, values, 0.0)
    if HAS_SCALE:
        values = values * tl.load(scale_ptr + row)
    tl.store(out_ptr + row.to(tl.int64) * n_cols + cols, values.to(out_ptr.dtype.element_ty), mask=in_row)


@jit
def _gather_sum_kernel(src_ptr, index_ptr, weight_ptr, out_ptr, n_src, n_cols,
                       K: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < n_cols
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.static_range(K):
        idx = tl.load(index_ptr + row * K + k).to(tl.int64)
        valid = (idx >= 0) & (idx < n_src)
        safe = tl.where(valid, idx, 0)
        values = tl.load(src_ptr + safe * n_cols + cols, mask=in_row, other=0.0).to(tl.float32)
        values = tl.where(valid, values, 0.0)
        if HAS_WEIGHT:
            values = values * tl.load(weight_ptr + row * K + k)
        acc += values
    tl.store(out_ptr + row.to(tl.int64) * n_cols + cols, acc.to(out_ptr.dtype.element_ty), mask=in_row)


def _gather_rows(src: torch.Tensor, index: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    n_rows, n_cols = index.numel(), src.shape[1]
    out = torch.empty(n_rows, n_cols, device=src.device, dtype=src.dtype)
    if n_rows == 0:
        return out
    block = min(BLOCK_COLS, next_power_of_2(n_cols))
    grid = (n_rows, triton.cdiv(n_cols, block))
    _gather_rows_kernel[grid](src, index.contiguous(), scale if scale is not None else src, out, src.shape[0], n_cols,
                              HAS_SCALE=scale is not None, BLOCK=block)
    return out


def _gather_sum(src: torch.Tensor, index: torch.Tensor, weight: torch.Tensor | None = None, out_dtype=None) -> torch.Tensor:
    n_rows, k = index.shape
    n_cols = src.shape[1]
    out = torch.empty(n_rows, n_cols, device=src.device, dtype=out_dtype or src.dtype)
    if n_rows == 0:
        return out
    block = min(BLOCK_COLS, next_power_of_2(n_cols))
    grid = (n_rows, triton.cdiv(n_cols, block))
    _gather_sum_kernel[grid](src, index.contiguous(), weight.contiguous() if weight is not None else src, out,
                             src.shape[0], n_cols, K=k, HAS_WEIGHT=weight is not None, BLOCK=block)
    return out


def _slot_weights(slots: torch.Tensor, weight: torch.Tensor, n_slots: int) -> torch.Tensor:
    """[n_slots] weight of the route occupying each slot (0 for empty slots)."""
    flat = slots.reshape(-1)
    target = torch.where((flat >= 0) & (flat < n_slots), flat, torch.full_like(flat, n_slots))
    return weight.new_zeros(n_slots + 1).scatter_(0, target, weight.reshape(-1).float())[:n_slots].float()


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, source, slots):
        ctx.save_for_backward(slots)
        ctx.n_tokens = tokens.shape[0]
        return _gather_rows(tokens.contiguous(), source)

    @staticmethod
    def backward(ctx, grad):
        (slots,) = ctx.saved_tensors
        return _gather_sum(grad.contiguous(), slots), None, None


class _Unpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, slots, weight, source):
        y = y.contiguous()
        weight = weight.float().contiguous()
        ctx.save_for_backward(y, slots, weight, source)
        return _gather_sum(y, slots, weight)

    @staticmethod
    def backward(ctx, grad):
        y, slots, weight, source = ctx.saved_tensors
        grad = grad.contiguous()
        grad_y = _gather_rows(grad, source, _slot_weights(slots, weight, y.shape[0]))
        grad_weight = None
        if ctx.needs_input_grad[2]:
            valid = (slots >= 0) & (slots < y.shape[0])
            routed = torch.cat([y, y.new_zeros(1, y.shape[1])]).index_select(0, torch.where(valid, slots, y.shape[0]).reshape(-1))
            grad_weight = (routed.view(*slots.shape, -1).float() * grad.float().unsqueeze(1)).sum(-1)
        return grad_y, None, grad_weight, None


def permute_rows_reference(tokens: torch.Tensor, source: torch.Tensor, slots: torch.Tensor | None = None) -> torch.Tensor:
    valid = (source >= 0) & (source < tokens.shape[0])
    padded = torch.cat([tokens, tokens.new_zeros(1, tokens.shape[1])])
    return padded.index_select(0, torch.where(valid, source, tokens.shape[0]))


def unpermute_rows_reference(y: torch.Tensor, slots: torch.Tensor, weight: torch.Tensor,
                             source: torch.Tensor | None = None) -> torch.Tensor:
    valid = (slots >= 0) & (slots < y.shape[0])
    padded = torch.cat([y, y.new_zeros(1, y.shape[1])])
    routed = padded.index_select(0, torch.where(valid, slots, y.shape[0]).reshape(-1)).view(*slots.shape, -1)
    return (routed.float() * weight.float().unsqueeze(-1)).sum(1).to(y.dtype)


def permute_rows(tokens: torch.Tensor, source: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """[S, M] tokens -> [P, M] rows tokens[source] (zeros for out-of-range sources)."""
    check_float_dtype(OP, tokens)
    if not use_triton(OP, _gather_rows_kernel, tokens, source, slots):
        return permute_rows_reference(tokens, source, slots)
    return _Permute.apply(tokens, source, slots)


def unpermute_rows(y: torch.Tensor, slots: torch.Tensor, weight: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """[P, M] expert outputs -> [S, M]: sum_k weight[s, k] * y[slots[s, k]] (fp32 accumulation)."""
    check_float_dtype(OP, y)
    if not use_triton(OP, _gather_sum_kernel, y, slots, weight, source):
        return unpermute_rows_reference(y, slots, weight, source)
    return _Unpermute.apply(y, slots, weight, source)
