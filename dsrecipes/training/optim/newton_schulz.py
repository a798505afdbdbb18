"""Newton-Schulz orthogonalisation: the matrix step of Muon.

What: `orthogonalize(G, steps, method, dtype)` returns an approximation of the orthogonal polar factor U V^T
of G = U S V^T (the nearest semi-orthogonal matrix) by the quintic iteration

    X_0 = G / (||G||_F + 1e-7)        X_{k+1} = a X_k + b (X_k X_k^T) X_k + c (X_k X_k^T)^2 X_k

with (a, b, c) = (3.4445, -4.7750, 2.0315), the coefficients Keller Jordan's Muon uses. They maximise the slope at
zero rather than converge: after 5 steps every singular value of X lies roughly in [0.68, 1.13] instead of at 1,
which costs training nothing and saves iterations (`SINGULAR_VALUE_RANGE`, checked against an SVD in the unit tests).
A tall matrix is iterated transposed, so X X^T is always the small Gram matrix.

Two ways of computing the same polynomial (`method`):
* ``standard``: the iteration above, two matmuls of the rectangular X per step.
* ``gram``: DeepSpeed's default. Every X_k is Q_k X_0 with Q_k a polynomial in R_0 = X_0 X_0^T, so the iteration
  runs on the n x n matrices R_k = X_k X_k^T and Q_k and touches the rectangular X twice in all (fewer FLOPs when
  m >> n). After two steps it re-forms X and R from Q (a "restart") so rounding in R does not compound; square
  matrices take the standard path (no saving). In fp32 the two agree to about 1e-6.

Both follow DeepSpeed 0.19.8's functions (zeropower_via_newtonschulz5 / zeropower_via_gram_newtonschulz) operation
for operation, the cast before or after the normalisation included, so that in fp16 / bf16, where another order
rounds differently by up to 0.1, they give DeepSpeed's bits (tests/unit/test_muon.py holds them bitwise equal).

`dtype` is the dtype the iteration runs in (fp32 for the equivalence tests; bf16/fp16 on an accelerator is
what the Muon papers run). `DEEPSPEED_DTYPES` states DeepSpeed 0.19.8's choice per method and device kind.
"""

from __future__ import annotations

import torch

COEFFICIENTS = (3.4445, -4.7750, 2.0315)
METHODS = ("standard", "gram")
# the singular values of 5 quintic steps from a Frobenius-normalised matrix (measured over random matrices of the
# shapes the unit tests use: the iteration does not converge to 1, by design)
SINGULAR_VALUE_RANGE = (0.6, 1.25)
_RESTART_AT = 2
# DeepSpeed 0.19.8 (runtime/zero/muon/original_muon.ns_compute_dtype): gram in fp16 where the device has fp16
# matmuls (CUDA; a CPU only with MKLDNN fp16), standard in bf16; fp32 where the device lacks the dtype
DEEPSPEED_DTYPES = {("gram", "cuda"): torch.float16, ("standard", "cuda"): torch.bfloat16,
                    ("gram", "cpu"): torch.float32, ("standard", "cpu"): torch.bfloat16}


def deepspeed_dtype(method: str, device: torch.device) -> torch.dtype:
    """The dtype DeepSpeed 0.19.8 runs `method` in on `device` (optimizer.ns_dtype=auto)."""
    if device.type == "cpu" and method == "gram" and torch.ops.mkldnn._is_mkldnn_fp16_supported():
        return torch.float16
    return DEEPSPEED_DTYPES.get((method, "cuda" if device.type != "cpu" else "cpu"), torch.float32)


def _normalised(matrix: torch.Tensor, dtype: torch.dtype, cast_first: bool) -> torch.Tensor:
    """matrix / (||matrix||_F + 1e-7) in `dtype`. DeepSpeed's order: the standard iteration casts and then divides
    (cast_first), the gram one divides in the input's dtype and then casts. Into fp16 the norm is always taken
    first, in fp32 at least (an fp16 cast of a large fp32 gradient would overflow to inf)."""
    if cast_first and dtype != torch.float16:
        x = matrix.to(dtype)
        return x / (torch.linalg.matrix_norm(x, keepdim=True) + 1e-7)
    wide = matrix.float() if matrix.dtype == torch.float16 else matrix
    return (wide / (torch.linalg.matrix_norm(wide, keepdim=True) + 1e-7)).to(dtype)


def _quintic(x: torch.Tensor, steps: int) -> torch.Tensor:
    a, b, c = COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


def _quintic_on_gram(x: torch.Tensor, steps: int, tall: bool) -> torch.Tensor:
    """The quintic iteration carried by R = X X^T and the accumulated left factor Q (X_k = Q X_restart), in
    DeepSpeed's order of operations (so that in fp16 the two round alike); returns X_steps, transposed back when
    the matrix was `tall`."""
    a, b, c = COEFFICIENTS
    r, q = x @ x.mT, None
    for step in range(steps):
        if step == _RESTART_AT:
            x = q @ x
            r, q = x @ x.mT, None
        z = b * r + c * r @ r
        if q is None:  # Q_1 = a I + Z_0
            q = z.clone()
            q.diagonal(dim1=-2, dim2=-1).add_(a)
        else:  # Q_{k+1} = (a I + Z_k) Q_k
            q = a * q + z @ q
        if step < steps - 1 and step + 1 != _RESTART_AT:  # R_{k+1} = (a I + Z_k)^2 R_k (they commute)
            rz = a * r + z @ r
            r = a * rz + z @ rz
    if q is None:
        return x.mT if tall else x
    return x.mT @ q.mT if tall else q @ x


def orthogonalize(matrix: torch.Tensor, steps: int = 5, method: str = "standard",
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The approximate orthogonal polar factor of a matrix, or of each matrix of a batch [B, rows, cols] (a stack of
    experts' weights), in `dtype`, the shape of `matrix`."""
    if matrix.ndim not in (2, 3):
        raise ValueError(f"Newton-Schulz orthogonalises a matrix or a batch of them; got shape {tuple(matrix.shape)}")
    if method not in METHODS:
        raise ValueError(f"Newton-Schulz method {method!r} is not one of {', '.join(METHODS)}")
    tall = matrix.size(-2) > matrix.size(-1)
    x = _normalised(matrix.mT if tall else matrix, dtype, cast_first=method == "standard")
    if method == "gram" and x.size(-2) != x.size(-1):
        return _quintic_on_gram(x, steps, tall)
    x = _quintic(x, steps)  # standard, and gram's square matrices (no saving: DeepSpeed iterates them so too)
    return x.mT if tall else x
