"""Rotary position embedding (RoPE) as a Triton kernel, forward and backward.

What: for q or k laid out [B, H, T, D] and tables cos, sin of shape [T_max, D/2] (the angles
pos * inv_freq, see dsrecipes.models.layers.rope_tables), the "halves" convention used by
dsrecipes.models.layers.apply_rope (GPT-NeoX / Llama-HF):

    x1, x2 = x[..., :D/2], x[..., D/2:]
    out    = cat(x1 * cos - x2 * sin, x1 * sin + x2 * cos)      at positions offset .. offset+T-1

The map is a rotation per (position, frequency) pair, so its backward is the inverse rotation
(sin -> -sin) applied to the incoming gradient: the same kernel with INVERSE=True.

Why: unfused this is a chunk, four multiplies, two adds and a cat (several reads/writes of q and k
plus autograd intermediates); fused it is one read and one write. q/k are read through their
strides (a [B, T, H, D] projection transposed to [B, H, T, D] needs no copy); the last dim must be
contiguous. The tables are read as fp32 and the rotation is computed in fp32.

Public: `rope(x, cos, sin, offset=0)` (alias `apply_rope`), `rope_reference`, `RoPEFunction`.
The tables get no gradient from the Triton path: when cos or sin requires grad, `rope` uses the
reference so their gradients stay correct.
"""

from __future__ import annotations

import torch

from dsrecipes.kernels._utils import check_float_dtype, jit, next_power_of_2, tl, triton, use_triton

OP = "rope"


@jit
def _rope_kernel(
    X, COS, SIN, Y, H, T, HALF, offset,
    sxb, sxh, sxt, syb, syh, syt, stride_cos, stride_sin,
    INVERSE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    """Program (b*H + h, j) rotates positions j*BLOCK_T .. of head h in batch b."""
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    t = (tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    c = tl.arange(0, BLOCK_HALF)
    mask = (t < T)[:, None] & (c < HALF)[None, :]
    x_ptrs = X + b * sxb + h * sxh + t[:, None] * sxt + c[None, :]
    x1 = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    pos = t + offset
    cos = tl.load(COS + pos[:, None] * stride_cos + c[None, :], mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(SIN + pos[:, None] * stride_sin + c[None, :], mask=mask, other=0.0).to(tl.float32)
    if INVERSE:
        sin = -sin
    y1 = x1 * cos - x2 * sin
    y2 = x1 * sin + x2 * cos
    y_ptrs = Y + b * syb + h * syh + t[:, None] * syt + c[None, :]
    tl.store(y_ptrs, y1.to(Y.dtype.element_ty), mask=mask)
    tl.store(y_ptrs + HALF, y2.to(Y.dtype.element_ty), mask=mask)


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """[..., T, D] -> [B, H, T, D] (a view for 2-, 3- and 4-D inputs), last dim contiguous."""
    if x.dim() == 4:
        x4 = x
    elif x.dim() < 4:
        x4 = x.reshape((1,) * (4 - x.dim()) + tuple(x.shape))
    else:
        x4 = x.reshape(-1, *x.shape[-3:])
    return x4 if x4.stride(-1) == 1 else x4.contiguous()


def _rope_launch(x4: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int, inverse: bool):
    """Rotate x4 [B, H, T, D] (any strides, unit last stride) into a new contiguous tensor."""
    B, H, T, D = x4.shape
    half = D // 2
    block_half = next_power_of_2(half)
    block_t = max(1, min(next_power_of_2(T), 4096 // block_half))
    y = torch.empty((B, H, T, D), dtype=x4.dtype, device=x4.device)
    grid = (B * H, triton.cdiv(T, block_t))
    _rope_kernel[grid](
        x4, cos, sin, y, H, T, half, int(offset),
        x4.stride(0), x4.stride(1), x4.stride(2), y.stride(0), y.stride(1), y.stride(2), cos.stride(0), sin.stride(0),
        INVERSE=inverse, BLOCK_T=block_t, BLOCK_HALF=block_half, num_warps=4,
    )
    return y


class RoPEFunction(torch.autograd.Function):
    """autograd wrapper: forward(x, cos, sin, offset) -> rotated x; backward rotates the grad back.

    No gradient for cos/sin (the public `rope` routes table gradients to the reference).
    """

    @staticmethod
    def forward(ctx, x, cos, sin, offset):
        y = _rope_launch(_as_4d(x), cos, sin, offset, inverse=False)
        ctx.save_for_backward(cos, sin)
        ctx.offset = offset
        ctx.shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        dx = _rope_launch(_as_4d(dy), cos, sin, ctx.offset, inverse=True)
        return dx.view(ctx.shape), None, None, None


def rope_reference(x, cos, sin, offset: int = 0):
    """Pure-torch RoPE (halves convention) in fp32, returned in x's dtype; same contract as `rope`."""
    T = x.shape[-2]
    c = cos[offset:offset + T].float()
    s = sin[offset:offset + T].float()
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).to(x.dtype)


def _check(x, cos, sin, offset):
    check_float_dtype(OP, x, cos, sin)
    if x.dim() < 2:
        raise ValueError(f"{OP}: x must be [..., T, D] (typically [B, H, T, D]), got shape {tuple(x.shape)}")
    T, D = x.shape[-2], x.shape[-1]
    if D % 2:
        raise ValueError(f"{OP}: the head dim D must be even (rotation pairs x[..., :D/2] with x[..., D/2:]), got {D}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 2 or t.shape[1] != D // 2:
            raise ValueError(f"{OP}: {name} must be [T_max, D/2] = [T_max, {D // 2}], got {tuple(t.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"{OP}: cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if offset < 0 or offset + T > cos.shape[0]:
        raise ValueError(f"{OP}: positions offset..offset+T-1 = {offset}..{offset + T - 1} exceed the "
                         f"tables' {cos.shape[0]} rows")


def rope(x, cos, sin, offset: int = 0):
    """Apply rotary embeddings to x [B, H, T, D] (any [..., T, D] works) at positions offset..offset+T-1.

    Args:
        x: q or k, fp16/bf16/fp32 (fp32 only on CPU under the Triton interpreter), even D.
        cos, sin: [T_max, D/2] tables (fp32 recommended; read as fp32), T_max >= offset + T.
        offset: position of x's first row (e.g. the KV-cache length when decoding).
    Returns a new contiguous tensor of x's shape and dtype. Gradients flow to x (and, via the
    reference path, to cos/sin if they require grad). ValueError on an odd D, bad table shapes,
    positions past the tables, or an unsupported dtype.
    """
    offset = int(offset)
    _check(x, cos, sin, offset)
    tables_need_grad = torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad)
    if x.numel() > 0 and not tables_need_grad and use_triton(OP, _rope_kernel, x, cos, sin):
        cos_c = cos if cos.stride(-1) == 1 else cos.contiguous()
        sin_c = sin if sin.stride(-1) == 1 else sin.contiguous()
        return RoPEFunction.apply(x, cos_c, sin_c, offset)
    return rope_reference(x, cos, sin, offset)


apply_rope = rope  # the name dsrecipes.models.layers uses, for drop-in replacement
