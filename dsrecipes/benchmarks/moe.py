"""MoE dispatch benchmark: sparse permute (torch / Triton) vs DeepSpeed's dense one-hot einsum.

    python -m dsrecipes.benchmarks.moe                       # CPU-sized defaults
    python -m dsrecipes.benchmarks.moe --tokens 16384 --experts 64 --d-model 2048 --out bench_out

For each token count it times forward + backward of gate -> dispatch -> experts (batched matmuls)
-> combine with each dispatch backend, in one process, side by side, and prints the time ratio to
the einsum path (and peak memory on a GPU). The einsum path builds [S, E, C] tensors, so its cost
grows with S * E * C = S^2 * k * capacity_factor; the sparse paths move S * k rows. Triton runs on
CUDA only here (the CPU interpreter is a correctness tool, not a benchmark). Rows go to
<out>/moe_dispatch.csv, .json and .png.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from dsrecipes.benchmarks.results import BarChart, write_rows
from dsrecipes.models import ModelConfig
from dsrecipes.models.moe import MoELayer
from dsrecipes.models.moe_config import MoEConfig
from dsrecipes.utils.dtypes import DTYPES


def _time_ms(layer: MoELayer, x: torch.Tensor, repeats: int) -> float:
    def step():
        layer(x).float().pow(2).mean().backward()

    step()  # warm-up (Triton compile, allocator)
    if x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    if x.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def run(tokens_list: list[int], experts: int, k: int, d_model: int, repeats: int, device: str, dtype: torch.dtype) -> list[dict]:
    cfg = ModelConfig(n_layer=1, n_head=1, d_model=d_model, vocab_size=8, max_seq_len=8, d_ff=2 * d_model)
    backends = ["einsum", "torch"] + (["triton"] if device == "cuda" else [])
    rows = []
    for num_tokens in tokens_list:
        x = torch.randn(1, num_tokens, d_model, device=device, dtype=dtype, requires_grad=True)
        timings = {}
        for backend in backends:
            torch.manual_seed(0)
            moe = MoEConfig(num_experts=experts, k=k, use_rts=False, top2_2nd_expert_sampling=False, dispatch=backend)
            layer = MoELayer(cfg, moe).to(device=device, dtype=dtype)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            ms = _time_ms(layer, x, repeats)
            peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
            timings[backend] = ms
            rows.append({
                "tokens": num_tokens, "experts": experts, "k": k, "d_model": d_model, "dtype": str(dtype).replace("torch.", ""),
                "device": device, "dispatch": backend, "ms_fwd_bwd": round(ms, 3),
                "speedup_vs_einsum": round(timings["einsum"] / ms, 3), "peak_mib": round(peak, 1) if peak else None,
            })
            print(f"S={num_tokens:6d} E={experts} k={k} M={d_model} {backend:7s} {ms:9.2f} ms  "
                  f"x{timings['einsum'] / ms:5.2f} vs einsum" + (f"  peak {peak:8.1f} MiB" if peak else ""))
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="default: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--out", type=Path, default=Path("bench_out"))
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = DTYPES[args.dtype or ("bf16" if device == "cuda" else "fp32")]
    rows = run(args.tokens, args.experts, args.k, args.d_model, args.repeats, device, dtype)
    args.out.mkdir(parents=True, exist_ok=True)
    chart = BarChart(f"MoE dispatch fwd+bwd on {device}", "ms", {"ms_fwd_bwd": ""},
                     labels=("dispatch", "tokens", "experts", "k"), better="min")
    print(f"rows: {write_rows(args.out, 'moe_dispatch', rows, chart=chart)}")
    return rows


if __name__ == "__main__":
    main()
