"""int8 weight quantization / dequantization as Triton kernels, symmetric or asymmetric, per channel
or per group.

What: a weight w [..., K] is cut into groups of `group_size` consecutive elements along the last
dim (granularity "group"), or one group per row (granularity "channel": group_size = K, one scale
per output row of a [N, K] linear weight). Per group, with round-to-nearest-even:

    symmetric:   scale = max|w| / 127,                  q = clamp(round(w / scale), -127, 127)
    asymmetric:  lo = min(min w, 0), hi = max(max w, 0), scale = (hi - lo) / 255,
                 zero_point = clamp(round(-lo / scale) - 128, -128, 127),
                 q = clamp(round(w / scale) + zero_point, -128, 127)

(an all-zero group gets scale 1). Dequantization is (q - zero_point) * scale. `scale` (fp32) and
`zero_point` (int32, None when symmetric) have shape [..., K // group_size]: [N, 1] per channel,
[N, K / group_size] per group, so one layout serves both and `int8_weight_only_matmul` takes it as is.

Exactness: the kernels divide with IEEE round-to-nearest (`div_rn`, not the GPU's approximate fp32
division) and round with the 1.5 * 2^23 add/subtract trick (exact round-half-even for |x| < 2^22,
and |w / scale| <= 255 here), so q, scale and zero_point equal the torch reference bit for bit.

Public: `quantize_int8`, `dequantize_int8` (Triton when it can run, else the references with a
one-time warning per op), `quantize_int8_reference`, `dequantize_int8_reference`.
"""

from __future__ import annotations

import torch

from dsrecipes.kernels._utils import (
    GPU_DTYPES,
    MAX_FUSED_COLS,
    check_float_dtype,
    jit,
    row_tile,
    tl,
    triton,
    use_triton,
)

OP_Q = "quantize_int8"
OP_DQ = "dequantize_int8"

_RNE_MAGIC = 12582912.0  # 1.5 * 2^23: (x + M) - M rounds x to the nearest integer, ties to even


# --------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------


@jit
def _quantize_kernel(
    W, Q, S, Z, R, G,
    ASYM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """W viewed as [R, G] contiguous groups; one program quantizes BLOCK_M groups (one block each)."""
    pid = tl.program_id(0)
    rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < R
    mask = rmask[:, None] & (cols < G)[None, :]
    offs = rows[:, None] * G + cols[None, :]
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)  # padding 0 never changes amax/min/max
    if ASYM:
        lo = tl.minimum(tl.min(w, axis=1), 0.0)
        hi = tl.maximum(tl.max(w, axis=1), 0.0)
        scale = tl.math.div_rn(hi - lo, 255.0)
        scale = tl.where(scale == 0.0, 1.0, scale)
        zp = (tl.math.div_rn(-lo, scale) + 12582912.0) - 12582912.0
        zp = tl.minimum(tl.maximum(zp - 128.0, -128.0), 127.0)
        t = (tl.math.div_rn(w, scale[:, None]) + 12582912.0) - 12582912.0
        q = tl.minimum(tl.maximum(t + zp[:, None], -128.0), 127.0)
        tl.store(Z + rows, zp.to(tl.int32), mask=rmask)
    else:
        amax = tl.max(tl.abs(w), axis=1)
        scale = tl.math.div_rn(amax, 127.0)
        scale = tl.where(scale == 0.0, 1.0, scale)
        t = (tl.math.div_rn(w, scale[:, None]) + 12582912.0) - 12582912.0
        q = tl.minimum(tl.maximum(t, -127.0), 127.0)
    tl.store(S + rows, scale, mask=rmask)
    tl.store(Q + offs, q.to(tl.int8), mask=mask)


@jit
def _dequantize_kernel(
    Q, S, Z, Y, R, G,
    HAS_ZP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Q viewed as [R, G] groups: y = (q - zero_point) * scale, in fp32, stored in Y's dtype."""
    pid = tl.program_id(0)
    rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < R
    mask = rmask[:, None] & (cols < G)[None, :]
    offs = rows[:, None] * G + cols[None, :]
    q = tl.load(Q + offs, mask=mask, other=0).to(tl.int32)
    if HAS_ZP:
        q = q - tl.load(Z + rows, mask=rmask, other=0)[:, None]
    s = tl.load(S + rows, mask=rmask, other=0.0)
    y = q.to(tl.float32) * s[:, None]
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------------------


def _group_size(op, k, granularity, group_size):
    if granularity == "channel":
        return k
    if granularity != "group":
        raise ValueError(f"{op}: granularity must be 'channel' or 'group', got {granularity!r}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"{op}: group_size must be a positive int, got {group_size!r}")
    if k % group_size != 0:
        raise ValueError(f"{op}: the last dimension ({k}) must be divisible by group_size ({group_size})")
    return group_size


def _check_quantize(w, mode, granularity, group_size):
    if not isinstance(w, torch.Tensor):
        raise ValueError(f"{OP_Q}: w must be a tensor")
    check_float_dtype(OP_Q, w)
    if w.dim() < 1 or w.shape[-1] == 0:
        raise ValueError(f"{OP_Q}: w must have at least one dimension with a non-empty last dim, got {tuple(w.shape)}")
    if mode not in ("symmetric", "asymmetric"):
        raise ValueError(f"{OP_Q}: mode must be 'symmetric' or 'asymmetric', got {mode!r}")
    gs = _group_size(OP_Q, w.shape[-1], granularity, group_size)
    if gs > MAX_FUSED_COLS:
        raise ValueError(f"{OP_Q}: a group (row) must have <= {MAX_FUSED_COLS} elements, got {gs}")
    return gs


def quantize_int8_reference(w, mode: str = "symmetric", granularity: str = "channel", group_size: int = 128):
    """Pure-torch quantizer with `quantize_int8`'s contract: (q int8, scale fp32, zero_point int32 or None)."""
    gs = _check_quantize(w, mode, granularity, group_size)
    k = w.shape[-1]
    out_shape = (*w.shape[:-1], k // gs)
    wg = w.float().reshape(-1, gs)
    if mode == "symmetric":
        scale = wg.abs().amax(-1) / 127.0
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        q = torch.round(wg / scale[:, None]).clamp_(-127, 127)
        zp = None
    else:
        lo = wg.amin(-1).clamp(max=0.0)
        hi = wg.amax(-1).clamp(min=0.0)
        scale = (hi - lo) / 255.0
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        zpf = (torch.round(-lo / scale) - 128.0).clamp_(-128, 127)
        q = (torch.round(wg / scale[:, None]) + zpf[:, None]).clamp_(-128, 127)
        zp = zpf.to(torch.int32).reshape(out_shape)
    return q.to(torch.int8).reshape(w.shape), scale.reshape(out_shape), zp


def _check_dequantize(q, scale, zero_point, group_size, dtype, op=OP_DQ):
    if not isinstance(q, torch.Tensor) or q.dtype != torch.int8:
        raise ValueError(f"{op}: q must be an int8 tensor, got {getattr(q, 'dtype', type(q))}")
    if q.dim() < 1 or q.shape[-1] == 0:
        raise ValueError(f"{op}: q must have a non-empty last dimension, got {tuple(q.shape)}")
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        raise ValueError(f"{op}: scale must be a float32 tensor, got {getattr(scale, 'dtype', type(scale))}")
    if dtype not in GPU_DTYPES:
        raise ValueError(f"{op}: unsupported output dtype {dtype}")
    k = q.shape[-1]
    lead = tuple(q.shape[:-1])
    if scale.dim() == q.dim() - 1 and tuple(scale.shape) == lead:  # per-channel scale given as [N]
        scale = scale.unsqueeze(-1)
    if scale.dim() != q.dim() or tuple(scale.shape[:-1]) != lead:
        raise ValueError(f"{op}: scale shape {tuple(scale.shape)} does not match q {tuple(q.shape)}: expected "
                         f"{lead + (k // (group_size or k),)}")
    n_groups = scale.shape[-1]
    if group_size is None:
        if n_groups < 1 or k % n_groups != 0:
            raise ValueError(f"{op}: scale's last dim {n_groups} does not divide q's last dim {k}")
        group_size = k // n_groups
    elif not isinstance(group_size, int) or group_size < 1 or k % group_size != 0:
        raise ValueError(f"{op}: the last dimension ({k}) must be divisible by group_size ({group_size})")
    elif n_groups != k // group_size:
        raise ValueError(f"{op}: scale has {n_groups} groups per row, expected {k // group_size} "
                         f"(group_size {group_size})")
    if zero_point is not None:
        if not isinstance(zero_point, torch.Tensor) or zero_point.dtype != torch.int32:
            raise ValueError(f"{op}: zero_point must be an int32 tensor or None, got "
                             f"{getattr(zero_point, 'dtype', type(zero_point))}")
        if zero_point.dim() == scale.dim() - 1:
            zero_point = zero_point.unsqueeze(-1)
        if zero_point.shape != scale.shape:
            raise ValueError(f"{op}: zero_point shape {tuple(zero_point.shape)} != scale shape {tuple(scale.shape)}")
    return scale, zero_point, group_size


def dequantize_int8_reference(q, scale, zero_point=None, group_size=None, dtype=torch.float32):
    """Pure-torch (q - zero_point) * scale per group, in fp32, returned in `dtype`."""
    scale, zero_point, gs = _check_dequantize(q, scale, zero_point, group_size, dtype)
    qg = q.reshape(-1, gs).to(torch.int32)
    if zero_point is not None:
        qg = qg - zero_point.reshape(-1, 1)
    return (qg.float() * scale.reshape(-1, 1)).to(dtype).reshape(q.shape)


# --------------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------------


def quantize_int8(w, mode: str = "symmetric", granularity: str = "channel", group_size: int = 128):
    """Quantize w [..., K] to int8 per output row ("channel") or per group of `group_size` along K.

    Args:
        w: fp16/bf16/fp32 weight (fp32 only on CPU under the Triton interpreter).
        mode: "symmetric" (zero_point None, q in [-127, 127]) or "asymmetric" (q in [-128, 127]).
        granularity: "channel" (group_size ignored) or "group".
        group_size: elements per group along the last dim (e.g. 32, 64, 128); must divide K.
    Returns:
        (q int8 shaped like w, scale fp32 [..., K // group_size], zero_point int32 like scale or None).
    Raises:
        ValueError: bad dtype/mode/granularity, or K not divisible by group_size.
    """
    gs = _check_quantize(w, mode, granularity, group_size)
    if w.numel() == 0 or not use_triton(OP_Q, _quantize_kernel, w):
        return quantize_int8_reference(w, mode, granularity, group_size)
    wc = w.contiguous()
    r = wc.numel() // gs
    out_shape = (*w.shape[:-1], w.shape[-1] // gs)
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scale = torch.empty(out_shape, dtype=torch.float32, device=w.device)
    asym = mode == "asymmetric"
    zp = torch.empty(out_shape, dtype=torch.int32, device=w.device) if asym else None
    block_m, block_n, num_warps = row_tile(gs)
    _quantize_kernel[(triton.cdiv(r, block_m),)](
        wc, q, scale, zp if zp is not None else scale, r, gs,
        ASYM=asym, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
    )
    return q, scale, zp


def dequantize_int8(q, scale, zero_point=None, group_size=None, dtype=torch.float32):
    """(q - zero_point) * scale per group (layout as returned by `quantize_int8`), in `dtype`.

    `group_size` defaults to K // scale.shape[-1]; a per-channel scale may also be given as [N].
    Raises ValueError on a non-int8 q, non-fp32 scale, non-int32 zero_point or mismatched shapes.
    """
    scale, zero_point, gs = _check_dequantize(q, scale, zero_point, group_size, dtype)
    probe = torch.empty(0, dtype=dtype, device=q.device)
    if q.numel() == 0 or not use_triton(OP_DQ, _dequantize_kernel, q, scale, zero_point, probe):
        return dequantize_int8_reference(q, scale, zero_point, gs, dtype)
    qc = q.contiguous()
    sc = scale.contiguous()
    zc = zero_point.contiguous() if zero_point is not None else None
    r = qc.numel() // gs
    y = torch.empty(q.shape, dtype=dtype, device=q.device)
    block_m, block_n, num_warps = row_tile(gs)
    _dequantize_kernel[(triton.cdiv(r, block_m),)](
        qc, sc, zc if zc is not None else sc, y, r, gs,
        HAS_ZP=zc is not None, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
    )
    return y
