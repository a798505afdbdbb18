"""Cross-entropy loss in Triton: over given logits, and fused with the LM-head matmul (chunked).

Why: at LLM vocab sizes the logits dominate activation memory (N=8192 rows x V=128256 is 2 GiB in
bf16, 4 GiB more if upcast to fp32 for the loss, and again for their gradient). Two entry points:

  * `cross_entropy(logits, targets)`: one program per row streams the vocab in blocks with an online
    log-sum-exp in fp32, so (possibly bf16) logits are never upcast as a whole. The forward saves the
    logits and the per-row log-sum-exp; the backward writes softmax - onehot, block by block, in the
    logits dtype (optionally over the logits' own storage, `inplace_backward=True`).

  * `fused_linear_cross_entropy(hidden, weight, targets)`: the logits `hidden @ weight.T` exist only one
    chunk of rows at a time. For each chunk the forward computes the chunk's logits (matmul in the
    input dtype), the Triton kernel computes each row's loss and overwrites the logits with their
    gradient (softmax - onehot) / num_valid, and the chunk's contributions to d hidden
    (grad_logits @ weight) and d weight (grad_logits.T @ hidden) are computed right away. The backward
    only scales the saved gradients by the incoming grad (Liger-style). Peak extra memory is one
    chunk of logits plus the gradients themselves, never [N, V].

Semantics match `torch.nn.functional.cross_entropy(logits.float(), targets, ignore_index=...)` with
mean reduction: rows whose target is `ignore_index` contribute 0 loss and 0 gradient, the mean is over
the remaining rows (NaN when every row is ignored, as in torch). Targets must otherwise lie in
[0, V): they are not range-checked on the device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsrecipes.kernels._utils import check_float_dtype, jit, next_power_of_2, tl, use_triton

__all__ = [
    "cross_entropy",
    "cross_entropy_reference",
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_reference",
    "CrossEntropyFunction",
    "FusedLinearCrossEntropyFunction",
]

_OP_CE = "cross_entropy"
_OP_FLCE = "fused_linear_cross_entropy"
DEFAULT_CHUNK_SIZE = 1024


# --------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------


@jit
def _ce_write_grad(x_row, g_row, target, lse, scale, V, BLOCK_V: tl.constexpr):
    """g_row[j] = (softmax(x_row)[j] - [j == target]) * scale, streamed over vocab blocks."""
    offs = tl.arange(0, BLOCK_V)
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        mask = cols < V
        x = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
        g = tl.exp(x - lse)
        g = tl.where(cols == target, g - 1.0, g) * scale
        tl.store(g_row + cols, g.to(g_row.dtype.element_ty), mask=mask)


@jit
def _ce_fwd_kernel(
    X, stride_x, Y, LOSS, LSE, SCALE, V, ignore_index,
    BLOCK_V: tl.constexpr, WRITE_GRAD: tl.constexpr,
):
    """Per row: loss = logsumexp(x) - x[target] (0 when ignored), lse saved.

    With WRITE_GRAD the row's logits are then overwritten in place with their gradient
    (softmax - onehot) * SCALE[0] (0 for ignored rows).
    """
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    target = tl.load(Y + row)
    ignored = target == ignore_index

    offs = tl.arange(0, BLOCK_V)
    m = tl.full([], float("-inf"), dtype=tl.float32)
    s = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        x = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        # Every block holds at least one real column, so m_new is finite.
        m_new = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    lse = m + tl.log(s)

    safe_target = tl.where(ignored, 0, target)
    x_target = tl.load(x_row + safe_target).to(tl.float32)
    tl.store(LOSS + row, tl.where(ignored, 0.0, lse - x_target))
    tl.store(LSE + row, lse)

    if WRITE_GRAD:
        scale = tl.where(ignored, 0.0, tl.load(SCALE))
        _ce_write_grad(x_row, x_row, target, lse, scale, V, BLOCK_V)


@jit
def _ce_bwd_kernel(
    X, stride_x, G, stride_g, Y, LSE, SCALE, V, ignore_index,
    BLOCK_V: tl.constexpr,
):
    """Per row: G = (softmax(X) - onehot(target)) * SCALE[0], from the saved log-sum-exp (G may alias X)."""
    row = tl.program_id(0).to(tl.int64)
    target = tl.load(Y + row)
    scale = tl.where(target == ignore_index, 0.0, tl.load(SCALE))
    lse = tl.load(LSE + row)
    _ce_write_grad(X + row * stride_x, G + row * stride_g, target, lse, scale, V, BLOCK_V)


# --------------------------------------------------------------------------------------------------
# Host launchers
# --------------------------------------------------------------------------------------------------


def _vocab_block(x: torch.Tensor) -> tuple[int, int]:
    """(BLOCK_V, num_warps): wide blocks on a GPU, small ones under the interpreter (tests see several)."""
    V = x.shape[-1]
    if not x.is_cuda:
        return min(64, next_power_of_2(V)), 1
    block = min(4096, next_power_of_2(V))
    return block, 8 if block >= 2048 else 4


def _rows_ready(x: torch.Tensor) -> torch.Tensor:
    """The kernels index the vocab with stride 1 (rows may be strided)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _ce_forward_rows(logits, targets, ignore_index: int, loss_rows, lse_rows, scale, write_grad: bool) -> None:
    """Launch `_ce_fwd_kernel` over the rows of a 2-D logits block (grad written in place if asked)."""
    n, V = logits.shape
    if n == 0:
        return
    block, warps = _vocab_block(logits)
    _ce_fwd_kernel[(n,)](
        logits, logits.stride(0), targets, loss_rows, lse_rows, scale, V, ignore_index,
        BLOCK_V=block, WRITE_GRAD=write_grad, num_warps=warps,
    )


def _grad_scale(num_valid: torch.Tensor, grad_output: torch.Tensor | None = None) -> torch.Tensor:
    """[1] fp32 device tensor grad_output / num_valid (num_valid clamped to 1: no host sync)."""
    scale = 1.0 / num_valid.clamp(min=1).to(torch.float32)
    if grad_output is not None:
        scale = scale * grad_output.to(torch.float32)
    return scale.reshape(1).contiguous()


class CrossEntropyFunction(torch.autograd.Function):
    """Mean cross entropy over [N, V] logits: Triton forward (loss + lse) and blockwise Triton backward."""

    @staticmethod
    def forward(ctx, logits, targets, ignore_index: int, inplace_backward: bool):
        logits = _rows_ready(logits)
        targets = targets.contiguous()
        n = logits.shape[0]
        loss_rows = torch.empty(n, device=logits.device, dtype=torch.float32)
        lse_rows = torch.empty(n, device=logits.device, dtype=torch.float32)
        num_valid = (targets != ignore_index).sum()
        dummy = torch.empty(1, device=logits.device, dtype=torch.float32)
        _ce_forward_rows(logits, targets, ignore_index, loss_rows, lse_rows, dummy, write_grad=False)
        ctx.save_for_backward(logits, targets, lse_rows, num_valid)
        ctx.ignore_index = ignore_index
        ctx.inplace_backward = inplace_backward
        return loss_rows.sum() / num_valid

    @staticmethod
    def backward(ctx, grad_output):
        logits, targets, lse_rows, num_valid = ctx.saved_tensors
        n, V = logits.shape
        grad = logits if ctx.inplace_backward else torch.empty_like(logits)
        if n > 0:
            block, warps = _vocab_block(logits)
            _ce_bwd_kernel[(n,)](
                logits, logits.stride(0), grad, grad.stride(0), targets, lse_rows,
                _grad_scale(num_valid, grad_output), V, ctx.ignore_index, BLOCK_V=block, num_warps=warps,
            )
        return grad, None, None, None


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    """Mean cross entropy of hidden @ weight.T, chunked; gradients are computed in the forward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index: int, chunk_size: int):
        n, d = hidden.shape
        V = weight.shape[0]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        write_grad = need_h or need_w
        targets = targets.contiguous()
        dev = hidden.device

        num_valid = (targets != ignore_index).sum()
        scale = _grad_scale(num_valid)
        loss_rows = torch.empty(n, device=dev, dtype=torch.float32)
        lse_rows = torch.empty(n, device=dev, dtype=torch.float32)
        grad_h = torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_h else None
        # fp32 accumulator across chunks unless the weight is fp32 already (then accumulate in place).
        grad_w = torch.zeros((V, d), device=dev, dtype=torch.float32) if need_w else None

        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            h = hidden[start:end]
            logits = h @ weight.t()  # [c, V] in the input dtype, contiguous; becomes its own gradient
            _ce_forward_rows(logits, targets[start:end], ignore_index, loss_rows[start:end], lse_rows[start:end],
                             scale, write_grad=write_grad)
            if need_h:
                torch.mm(logits, weight, out=grad_h[start:end])
            if need_w:
                if logits.dtype == torch.float32:
                    grad_w.addmm_(logits.t(), h)
                else:
                    grad_w.add_(logits.t() @ h)
            del logits

        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return loss_rows.sum() / num_valid

    @staticmethod
    def backward(ctx, grad_output):
        grad_h, grad_w = ctx.saved_tensors
        g = grad_output.to(torch.float32)
        dh = (grad_h * g).to(grad_h.dtype) if grad_h is not None else None
        dw = (grad_w * g).to(ctx.weight_dtype) if grad_w is not None else None
        return dh, dw, None, None, None


# --------------------------------------------------------------------------------------------------
# References and public entry points
# --------------------------------------------------------------------------------------------------


def cross_entropy_reference(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Pure torch: F.cross_entropy on fp32-upcast logits [..., V], mean over non-ignored targets."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1).long(),
                           ignore_index=ignore_index)


def fused_linear_cross_entropy_reference(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Pure torch: materialise hidden @ weight.T then `cross_entropy_reference` (chunk_size is ignored)."""
    del chunk_size
    hidden = hidden.reshape(-1, hidden.shape[-1])
    return cross_entropy_reference(hidden @ weight.t(), targets, ignore_index)


def _check_targets(op: str, targets: torch.Tensor, n: int) -> None:
    if targets.numel() != n:
        raise ValueError(f"{op}: expected {n} targets, got shape {tuple(targets.shape)}")
    if targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{op}: targets must be int64 or int32, got {targets.dtype}")


def cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, inplace_backward: bool = False
) -> torch.Tensor:
    """Mean cross entropy of `logits` [..., V] (fp32/bf16/fp16) against integer `targets` [...].

    The loss is computed in fp32 whatever the logits dtype; the gradient has the logits dtype. Rows
    whose target equals `ignore_index` add 0 loss and 0 gradient; the mean is over the other rows.

    Args:
        inplace_backward: write the gradient over the logits' own storage in the backward, saving one
            [N, V] buffer. Only safe when nothing else reads those logits afterwards (or saved them for
            its own backward).

    Returns a 0-dim fp32 tensor. Runs Triton on CUDA tensors or CPU fp32 tensors under TRITON_INTERPRET=1;
    otherwise warns once and uses `cross_entropy_reference`.
    """
    if logits.dim() < 1:
        raise ValueError(f"{_OP_CE}: logits must be [..., V], got a scalar")
    V = logits.shape[-1]
    logits2 = logits.reshape(-1, V)
    _check_targets(_OP_CE, targets, logits2.shape[0])
    check_float_dtype(_OP_CE, logits)
    if V == 0 or not use_triton(_OP_CE, _ce_fwd_kernel, logits, targets):
        return cross_entropy_reference(logits, targets, ignore_index)
    return CrossEntropyFunction.apply(logits2, targets.reshape(-1), int(ignore_index), bool(inplace_backward))


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """Mean cross entropy of `hidden @ weight.T` without materialising the [N, V] logits.

    Args:
        hidden: [..., d] activations (fp32/bf16/fp16), flattened to N rows.
        weight: [V, d] output projection (LM head), same dtype as `hidden`.
        targets: [...] integer targets, N in total; `ignore_index` rows add 0 loss and 0 gradient.
        chunk_size: rows per chunk; one chunk's [chunk_size, V] logits is the largest temporary.

    Returns a 0-dim fp32 tensor. The gradients for `hidden` and `weight` are computed during the
    forward (only for the inputs that require grad) and scaled in the backward; d weight accumulates
    in fp32 across chunks. Runs Triton on CUDA tensors or CPU fp32 tensors under TRITON_INTERPRET=1;
    otherwise warns once and uses `fused_linear_cross_entropy_reference`.
    """
    if hidden.dim() < 1 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"{_OP_FLCE}: need hidden [..., d] and weight [V, d], got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if int(chunk_size) < 1:
        raise ValueError(f"{_OP_FLCE}: chunk_size must be >= 1, got {chunk_size}")
    check_float_dtype(_OP_FLCE, hidden, weight)
    if hidden.dtype != weight.dtype:
        raise ValueError(f"{_OP_FLCE}: hidden and weight must share a dtype, got {hidden.dtype} and {weight.dtype}")
    hidden2 = hidden.reshape(-1, hidden.shape[-1])
    _check_targets(_OP_FLCE, targets, hidden2.shape[0])
    if weight.shape[0] == 0 or not use_triton(_OP_FLCE, _ce_fwd_kernel, hidden, weight, targets):
        return fused_linear_cross_entropy_reference(hidden, weight, targets, ignore_index)
    return FusedLinearCrossEntropyFunction.apply(hidden2, weight, targets.reshape(-1), int(ignore_index),
                                                 int(chunk_size))
