"""Block-sparse vs dense causal attention: time and memory against sequence length at a fixed layout.

    python -m dsrecipes.benchmarks.sparse_attention                                  # CPU defaults
    python -m dsrecipes.benchmarks.sparse_attention --seq-lens 1024 2048 4096 8192 16384 --heads 16 --dim 64
    python -m dsrecipes.benchmarks.sparse_attention --layout sliding_window --out bench/sparse

The layout config is fixed (default: BigBird, block 16, window 3, 1 global, 1 random, causal), so each
query block sees a constant number of key blocks and block-sparse attention should cost ~linearly in
T, while dense attention's time grows ~quadratically. For each T it times forward+backward (best of
--repeats, after one warm-up) of:

  * dense     torch SDPA, is_causal=True (the model's default path);
  * sparse    on CUDA the Triton block-sparse kernel, on CPU the gathered pure-torch path
              (`block_sparse_attention_gathered`: only the attended key blocks, ~linear memory);
  * masked    (with --with-masked) dense attention with the expanded layout mask, the reference.

Memory: on CUDA the peak allocated during one forward+backward (torch.cuda.max_memory_allocated,
inputs included); on CPU the bytes autograd saves for the backward during the forward (a
deterministic measure of activation memory). "growth" is time(T) / time(previous T): ~2 per doubling
is linear, ~4 quadratic. Writes sparse_attention.csv/.json/.md/.png to --out.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dsrecipes.benchmarks.results import BarChart, write_rows
from dsrecipes.distributed.activation_checkpoint import saved_activation_bytes
from dsrecipes.kernels import block_sparse_attention as bsa
from dsrecipes.models.sparse_attention import SparseAttentionConfig, build_sparsity_config
from dsrecipes.utils.dtypes import DTYPES


def _dense(q, k, v, layout, block):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _sparse(q, k, v, layout, block, index=None):
    if q.is_cuda:
        return bsa.block_sparse_attention(q, k, v, layout, block, causal=True, index=index)
    return bsa.block_sparse_attention_gathered(q, k, v, layout, block, causal=True)


def _masked(q, k, v, layout, block):
    return bsa.block_sparse_attention_reference(q, k, v, layout, block, causal=True)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(fn, q, k, v, repeats: int) -> tuple[float, int]:
    """(best-of-`repeats` ms of forward+backward, memory bytes: CUDA peak, or CPU bytes saved for backward).

    The minimum, not the median: on a shared CPU other processes only ever add time.
    """
    device = q.device
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def step():
        out = fn(*leaves)
        out.backward(torch.ones_like(out))

    step()  # warm-up (Triton compile, allocator)
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        step()
        memory = torch.cuda.max_memory_allocated(device)
    else:
        memory = saved_activation_bytes(fn, *leaves)
    return min(times), memory


def run(args) -> list[dict]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype]
    sa = SparseAttentionConfig(mode=args.layout, block=args.block, num_random_blocks=1 if args.layout == "bigbird" else 0)
    layout_cfg = build_sparsity_config(sa, args.heads)
    impls = {"dense": _dense, "sparse": _sparse}
    if args.with_masked:
        impls["masked"] = _masked
    rows, previous = [], {}
    g = torch.Generator().manual_seed(0)
    for T in args.seq_lens:
        layout = torch.tril(layout_cfg.make_layout(T)).to(device)
        index = bsa.BlockSparseIndex.from_layout(layout, causal=True, device=device) if device.type == "cuda" else None
        q, k, v = (torch.randn(args.batch, args.heads, T, args.dim, generator=g).to(device, dtype) for _ in range(3))
        row = {"T": T, "layout": args.layout, "block": args.block, "device": str(device), "dtype": args.dtype,
               "nnz_blocks_per_head": int(layout[0].sum()),
               "dense_blocks_per_head": (T // args.block) * (T // args.block + 1) // 2}
        for name, fn in impls.items():
            call = (lambda q, k, v, fn=fn, layout=layout, index=index: fn(q, k, v, layout, args.block, index)) \
                if name == "sparse" else (lambda q, k, v, fn=fn, layout=layout: fn(q, k, v, layout, args.block))
            ms, mem = measure(call, q, k, v, args.repeats)
            row[f"{name}_ms"] = round(ms, 3)
            row[f"{name}_mem_mib"] = round(mem / 2**20, 4)
            row[f"{name}_growth"] = round(ms / previous[name], 2) if name in previous else None
            previous[name] = ms
        row["dense_over_sparse"] = round(row["dense_ms"] / row["sparse_ms"], 2)
        rows.append(row)
        print(" | ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return rows


def print_table(rows: list[dict]):
    """The timings as a rich Table, printed uncut (dsrecipes.utils.console); returns the table."""
    from rich.table import Table

    from dsrecipes.utils.console import make_console
    from dsrecipes.utils.console import print_table as print_uncut

    table = Table(title=f"causal attention fwd+bwd, {rows[0]['layout']} block {rows[0]['block']} on {rows[0]['device']}")
    short = {"nnz_blocks_per_head": "blocks", "dense_blocks_per_head": "of", "dense_over_sparse": "dense/sparse"}
    cols = [c for c in rows[0] if c not in ("layout", "block", "device", "dtype")]
    for c in cols:
        table.add_column(short.get(c, c.replace("_mem_mib", " MiB").replace("_growth", " x").replace("_ms", " ms")),
                         justify="right")
    for r in rows:
        table.add_row(*("-" if r[c] is None else str(r[c]) for c in cols))
    print_uncut(make_console(), table)
    return table


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--layout", default="bigbird",
                        choices=["bigbird", "bslongformer", "sliding_window", "fixed", "variable", "dense"])
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU); steadier timings with 1")
    parser.add_argument("--with-masked", action="store_true", help="also time the dense masked reference")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(args)
    table = print_table(rows)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        chart = BarChart(table.title, "ms", {"dense_ms": "dense", "sparse_ms": "sparse"}, labels=("T",), better="min")
        print("wrote", write_rows(args.out, "sparse_attention", rows, table, chart))
    return rows


if __name__ == "__main__":
    main()
