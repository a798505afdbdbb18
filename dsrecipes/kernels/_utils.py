"""Shared helpers for the dsrecipes.kernels Triton ops.

Every op module (norms, activations, RoPE, softmax, attention, loss) follows the same pattern: a
Triton kernel, an autograd.Function around it, a pure-torch `<op>_reference`, and a public function
that takes the Triton path when Triton can actually run on the given tensors and otherwise falls back
to the reference (warning once per op). The decision, the warning, the dtype/shape checks and the
block-size arithmetic live here so the ops agree on them.

Triton may be missing (CPU-only installs, macOS). Importing this module never fails: `triton` and
`tl` are then `None`-like stubs, `jit` is an identity decorator (so kernel definitions still parse
and are simply never launched) and `triton_available()` is False.

Triton runs on CPU tensors only under its interpreter, which it selects when a kernel is *decorated*
(`TRITON_INTERPRET=1` must be in the environment before the kernel module is imported). So the
check is made on the decorated kernel itself (`kernel_is_interpreted`), not on the environment now.
The interpreter computes through numpy, which has no bfloat16: on CPU only fp32 takes the Triton path.

Only torch and triton may be imported here (this package must not depend on the rest of dsrecipes).
"""

from __future__ import annotations

import functools
import warnings

import torch

try:  # Triton is optional: without it every op uses its pure-torch reference.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only on installs without triton
    HAS_TRITON = False

    class _TritonStub:
        """Stand-in for `triton` so kernel definitions still parse; never launched."""

        @staticmethod
        def jit(fn=None, **_kwargs):
            return fn if fn is not None else (lambda f: f)

        @staticmethod
        def cdiv(a: int, b: int) -> int:
            return -(-a // b)

    class _LanguageStub:
        """Stand-in for `triton.language`: only what kernel signatures touch at definition time."""

        constexpr = object

    triton = _TritonStub()  # type: ignore[assignment]
    tl = _LanguageStub()  # type: ignore[assignment]

jit = triton.jit

# The widest row a single-block row kernel keeps in registers (norms, softmax, cross entropy...).
MAX_FUSED_COLS = 65536
# Floating dtypes the kernels accept on a GPU; under the CPU interpreter only fp32.
GPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INTERPRETER_DTYPES = (torch.float32,)

_WARNED: set[str] = set()


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1): Triton block extents must be powers of two."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-int(a) // int(b))


def triton_available() -> bool:
    """True when the `triton` package imported (says nothing about a GPU being present)."""
    return HAS_TRITON


def kernel_is_interpreted(kernel) -> bool:
    """True when `kernel` was decorated under TRITON_INTERPRET=1 and so runs on CPU tensors."""
    return HAS_TRITON and type(kernel).__name__ == "InterpretedFunction"


def triton_unavailable_reason(kernel, *tensors: torch.Tensor | None) -> str | None:
    """Why `kernel` cannot run on `tensors` (None when it can).

    Runnable means: triton imported, and either every tensor is on a CUDA device, or every tensor is
    on the CPU, the kernel was decorated under the interpreter and every floating tensor is fp32.
    """
    if not HAS_TRITON:
        return "triton is not installed"
    ts = [t for t in tensors if t is not None]
    if not ts:
        return "no tensors"
    if all(t.is_cuda for t in ts):
        return None
    if all(t.device.type == "cpu" for t in ts):
        if not kernel_is_interpreted(kernel):
            return "CPU tensors need TRITON_INTERPRET=1 set before the kernels are imported"
        bad = sorted({str(t.dtype) for t in ts if t.is_floating_point() and t.dtype not in INTERPRETER_DTYPES})
        if bad:
            return f"the Triton interpreter runs fp32 only, got {', '.join(bad)}"
        return None
    return "tensors are on " + ", ".join(sorted({str(t.device) for t in ts}))


def warn_fallback(op: str, reason: str) -> None:
    """Warn (once per op per process) that `op` is using its pure-torch reference, and why."""
    if op in _WARNED:
        return
    _WARNED.add(op)
    warnings.warn(f"dsrecipes.kernels.{op}: Triton path unavailable ({reason}); using the pure-torch reference",
                  RuntimeWarning, stacklevel=3)


def use_triton(op: str, kernel, *tensors: torch.Tensor | None) -> bool:
    """True when `kernel` can run on `tensors`; otherwise warn once for `op` and return False."""
    reason = triton_unavailable_reason(kernel, *tensors)
    if reason is None:
        return True
    warn_fallback(op, reason)
    return False


def check_float_dtype(op: str, *tensors: torch.Tensor | None, allowed=GPU_DTYPES) -> None:
    """ValueError naming `op` unless every given tensor has a floating dtype in `allowed`."""
    for t in tensors:
        if t is not None and t.dtype not in allowed:
            names = ", ".join(str(d).replace("torch.", "") for d in allowed)
            raise ValueError(f"{op}: unsupported dtype {str(t.dtype).replace('torch.', '')}; supported: {names}")


def check_max_cols(op: str, n_cols: int, limit: int = MAX_FUSED_COLS) -> None:
    """ValueError naming `op` when a row of `n_cols` elements does not fit one block."""
    if n_cols > limit:
        raise ValueError(f"{op}: the last dimension must be <= {limit} (one row per block), got {n_cols}")


@functools.cache  # called on every launch with a few distinct widths: keep it off the host path
def row_tile(n_cols: int, max_tile_elems: int = 4096) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for a row-wise kernel over rows of `n_cols` elements.

    BLOCK_N covers the whole row (next power of two, masked); narrow rows are packed several to a
    program (BLOCK_M rows) so a tile holds about `max_tile_elems` elements; num_warps grows with the tile.
    """
    block_n = next_power_of_2(max(n_cols, 1))
    block_m = max(1, max_tile_elems // block_n)
    num_warps = min(max((block_m * block_n) // 512, 1), 16)
    return block_m, block_n, num_warps


@functools.cache
def _sm_count(index: int) -> int:
    """The streaming-multiprocessor count of CUDA device `index` (asked once per device, not per launch)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def reduction_programs(device: torch.device, n_tiles: int) -> int:
    """How many programs a kernel that also reduces across rows (weight grads) should launch.

    On a GPU two per SM (each loops over several row tiles and writes one partial sum); under the
    interpreter few, since each program costs Python time. Never more than the number of tiles.
    """
    if device.type == "cuda":
        n = 2 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    else:
        n = 2
    return max(1, min(n, n_tiles))
