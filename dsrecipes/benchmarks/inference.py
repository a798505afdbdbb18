"""Inference benchmark: dsrecipes' inference engine against the plain model's no-cache generate loop.

    python -m dsrecipes.benchmarks.inference --model gpt_1_3b --dtype bf16 --batch 1 8 --out bench/inference   # GPU
    python -m dsrecipes.benchmarks.inference --model gpt_tiny --batch 1 8 --new-tokens 32                     # CPU
    python -m dsrecipes.benchmarks.inference --checkpoint outputs/<date>/<time>_gpt --batch 1 4
    python -m dsrecipes mode=serve-bench generate.checkpoint=outputs/<date>/<time>_gpt    # the same, as a recipe

Implementations, each on its own copy of the same weights, measured side by side in one run:
  plain       the model's own forward over the whole sequence for every token, greedy (what
              dsrecipes.models.sampling does, batched): no KV cache, no fused kernels;
  engine      init_inference(model, dtype): preallocated KV cache, one token per decode step;
  kernels     + kernel_inject (fused norms, flash prefill, decode-attention kernel, fused MLP
              activations); GPU only: on CPU without the interpreter the kernels would fall back;
  int8        + weight-only int8 (dsrecipes.kernels int8 matmul);
  int4        + weight-only int4 (groups of 64, torch dequantization: memory only);
  graph       kernels + the decode step replayed as a CUDA graph (enable_cuda_graph); GPU only;
  int8_graph  int8 + kernels + CUDA graph; GPU only;
  hf          Hugging Face transformers' generate for the same weights: only if transformers is
              installed (it is not a dependency; the row is then skipped and the script says so).

Per implementation and batch size: time to first token (prefill + first token), prefill tokens/s,
decode tokens/s (new tokens after the first / decode time), per-token latency, peak memory (CUDA:
max_memory_allocated; CPU: weights + KV cache bytes), weight MiB, and ratios against `plain`
(decode speed-up, TTFT speed-up) and, for int8, decode speed against the engine at the same dtype.
At batch 1 on CUDA it also reports the fraction of the memory-bandwidth limit reached,
(weight bytes / --hbm-gbps) / per-token latency; the issue's targets are >= 70% for a 1.3B model in
bf16 and int8 decode >= 1.6x bf16. Every row is the median of --repeats runs after a warm-up.
Writes inference.csv, inference.json, inference.md (the table) and inference.png (decode tokens/s) to --out.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import tempfile
import warnings
from pathlib import Path

import torch
from omegaconf import OmegaConf

from dsrecipes.benchmarks.results import BarChart, write_rows
from dsrecipes.inference import init_inference, load_model
from dsrecipes.inference.config import BENCH_IMPLS
from dsrecipes.inference.quantized import module_bytes
from dsrecipes.models import GPT, ModelConfig
from dsrecipes.utils.dtypes import DTYPES

IMPLS = BENCH_IMPLS  # the generate group's BenchImpl values (generate.bench_impls)
DECODE_CHART = BarChart("decode throughput", "decode tokens/s", {"decode_tok_s": ""}, labels=("impl", "batch"))
# Peak memory bandwidth in GB/s (vendor datasheets), matched in order against torch.cuda.get_device_name():
# the batch-1 decode roofline's denominator when --hbm-gbps is not given.
HBM_GBPS = (("H200", 4800.0), ("H100 PCIe", 2000.0), ("H100 NVL", 3900.0), ("H100", 3350.0))


def known_hbm_gbps(device_name: str | None) -> float | None:
    """The memory bandwidth of a known GPU by name (H200 4800, H100 SXM 3350 GB/s), else None."""
    for key, gbps in HBM_GBPS:
        if device_name and key in device_name:
            return gbps
    return None


GPU_ONLY = {"kernels": "the Triton kernels need a GPU; on CPU they would run their torch references",
            "graph": "CUDA graphs need a GPU", "int8_graph": "CUDA graphs need a GPU"}


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def model_from_name(name: str, vocab_size: int, max_seq_len: int | None) -> GPT:
    import dsrecipes.conf

    conf_dir = Path(dsrecipes.conf.__file__).parent / "model"
    if not (conf_dir / f"{name}.yaml").exists():
        choices = sorted(p.stem for p in conf_dir.glob("*.yaml"))
        raise ValueError(f"--model={name!r} is not valid; choose one of: {', '.join(choices)}")
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(conf_dir / f"{name}.yaml")))
    cfg.vocab_size = cfg.vocab_size or vocab_size
    if max_seq_len:
        cfg.max_seq_len = max_seq_len
    torch.manual_seed(0)
    return GPT(cfg).eval()


@torch.no_grad()
def plain_generate(model: GPT, ids: torch.Tensor, new_tokens: int) -> tuple[float, list[float]]:
    """Greedy no-cache loop over the full sequence; returns (time to first token, per-step latencies)."""
    _sync(ids.device)
    t0 = __import__("time").perf_counter()
    steps = []
    for _i in range(new_tokens):
        nxt = model(ids).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        _sync(ids.device)
        now = __import__("time").perf_counter()
        steps.append(now - t0)
        t0 = now
    return steps[0], steps[1:]


def _hf_model(model: GPT):
    """A transformers GPT2LMHeadModel with the same weights (gpt2-style models only), or None: dsrecipes' own
    Hugging Face layout (dsrecipes.models.hf_config / hf_weights, what the export writes), loaded in memory."""
    if model.cfg.style != "gpt2" or importlib.util.find_spec("transformers") is None:
        return None
    from transformers import AutoConfig, AutoModelForCausalLM

    from dsrecipes.models.hf_config import hf_config_for
    from dsrecipes.models.hf_weights import to_hf_state

    c = model.cfg
    fields = hf_config_for(c, bos_id=None, eos_id=None)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))
    missing, unexpected = hf.load_state_dict(to_hf_state(model.state_dict(), c), strict=False)
    buffers = {name for name, _ in hf.named_buffers()}
    if unexpected or set(missing) - buffers - ({"lm_head.weight"} if c.tie_embeddings else set()):
        raise RuntimeError(f"weights do not map onto transformers' GPT-2: missing {missing}, unexpected {unexpected}")
    if c.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


def measure(impl: str, base: GPT, batch: int, prompt_len: int, new_tokens: int, dtype: torch.dtype,
            device: str, repeats: int) -> dict | None:
    """One row: medians over `repeats` runs (after one warm-up) of one implementation at one batch size."""
    model = copy.deepcopy(base)
    torch.manual_seed(1)
    ids = torch.randint(0, model.cfg.vocab_size, (batch, prompt_len), device=device)
    engine = None
    if impl == "plain":
        model = model.to(device=device, dtype=dtype)
        run = lambda: plain_generate(model, ids, new_tokens)  # noqa: E731
        weight_bytes, cache_bytes = module_bytes(model), 0
    elif impl == "hf":
        hf = _hf_model(model)
        if hf is None:
            return None
        hf = hf.to(device=device, dtype=dtype)

        def run():
            _sync(device)
            t0 = __import__("time").perf_counter()
            hf.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False, pad_token_id=0)
            _sync(device)
            t1 = __import__("time").perf_counter()
            hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            _sync(device)
            total = __import__("time").perf_counter() - t1
            ttft = t1 - t0
            return ttft, [(total - ttft) / max(new_tokens - 1, 1)] * (new_tokens - 1)
        weight_bytes, cache_bytes = module_bytes(hf), 0
    else:
        graph = {"kernel_inject": True, "enable_cuda_graph": True}
        options = {"engine": {}, "kernels": {"kernel_inject": True}, "int8": {"quant": "int8"},
                   "int4": {"quant": {"bits": 4, "group_size": 64}}, "graph": graph,
                   "int8_graph": {**graph, "quant": "int8"}}[impl]
        name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
        engine = init_inference(model, dtype=name, device=device, max_out_tokens=prompt_len + new_tokens, **options)

        def run():
            r = engine.generate(ids.tolist(), max_new_tokens=new_tokens, stop_tokens=[])
            return r.prefill_s, r.step_latencies_s
        weight_bytes = engine.weight_bytes()
        cache_bytes = 0
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run()  # warm-up (kernel compilation, cache allocation)
        results = [run() for _ in range(repeats)]
    if engine is not None:
        cache_bytes = engine._cache.nbytes
    ttft = statistics.median(r[0] for r in results)
    step = statistics.median(statistics.median(r[1]) if r[1] else float("nan") for r in results)
    peak = torch.cuda.max_memory_allocated() if torch.device(device).type == "cuda" else weight_bytes + cache_bytes
    return {
        "impl": impl, "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
        "dtype": str(dtype).replace("torch.", ""), "device": str(device),
        "ttft_ms": ttft * 1e3, "prefill_tok_s": batch * prompt_len / ttft,
        "decode_tok_s": batch / step, "per_token_ms": step * 1e3,
        "peak_mem_mib": peak / 2**20, "weight_mib": weight_bytes / 2**20,
    }


def add_ratios(rows: list[dict], hbm_gbps: float | None) -> None:
    by = {(r["impl"], r["batch"]): r for r in rows}
    for r in rows:
        plain = by.get(("plain", r["batch"]))
        r["decode_x_plain"] = r["decode_tok_s"] / plain["decode_tok_s"] if plain else None
        r["ttft_x_plain"] = plain["ttft_ms"] / r["ttft_ms"] if plain else None
        engine = by.get(("engine", r["batch"]))
        r["decode_x_engine"] = r["decode_tok_s"] / engine["decode_tok_s"] if engine else None
        r["bandwidth_frac"] = None
        if hbm_gbps and r["device"].startswith("cuda") and r["batch"] == 1:
            r["bandwidth_frac"] = (r["weight_mib"] * 2**20 / (hbm_gbps * 1e9)) / (r["per_token_ms"] / 1e3)


def run_benchmark(model: GPT, batches: list[int], prompt_len: int, new_tokens: int, dtype: torch.dtype,
                  device: str, repeats: int, impls: list[str], hbm_gbps: float | None = None) -> list[dict]:
    if prompt_len + new_tokens > model.cfg.max_seq_len:
        raise ValueError(f"--prompt-len {prompt_len} + --new-tokens {new_tokens} "
                         f"exceed model.max_seq_len={model.cfg.max_seq_len}")
    unknown = set(impls) - set(IMPLS)
    if unknown:
        raise ValueError(f"--impls {sorted(unknown)} are not valid; choose from: {', '.join(IMPLS)}")
    rows = []
    for batch in batches:
        for impl in impls:
            if impl in GPU_ONLY and torch.device(device).type != "cuda":
                print(f"{impl}: skipped on CPU ({GPU_ONLY[impl]})")
                continue
            row = measure(impl, model, batch, prompt_len, new_tokens, dtype, device, repeats)
            if row is None:
                print("hf: skipped (transformers is not installed, or the model is not gpt2-style)")
                continue
            rows.append(row)
            print(f"  {impl:8s} batch {batch:3d}: decode {row['decode_tok_s']:10.1f} tok/s, ttft {row['ttft_ms']:8.2f} ms")
    add_ratios(rows, hbm_gbps)
    return rows


def print_table(rows: list[dict], title: str):
    """The results as a rich Table, printed uncut (dsrecipes.utils.console); returns the table."""
    from rich.table import Table

    from dsrecipes.utils.console import make_console
    from dsrecipes.utils.console import print_table as print_uncut

    table = Table(title=title)
    columns = ("impl", "batch", "TTFT ms", "prefill tok/s", "decode tok/s", "ms/token", "peak MiB", "weights MiB",
               "decode x plain", "TTFT x plain", "x engine", "% HBM bw")
    for c in columns:
        table.add_column(c, justify="right")
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for r in rows:
        table.add_row(r["impl"], str(r["batch"]), fmt(r["ttft_ms"], ".2f"), fmt(r["prefill_tok_s"], ",.0f"),
                      fmt(r["decode_tok_s"], ",.1f"), fmt(r["per_token_ms"], ".3f"), fmt(r["peak_mem_mib"], ".1f"),
                      fmt(r["weight_mib"], ".1f"), fmt(r["decode_x_plain"], ".2f"), fmt(r["ttft_x_plain"], ".2f"),
                      fmt(r["decode_x_engine"], ".2f"), fmt(r["bandwidth_frac"] and 100 * r["bandwidth_frac"], ".0f"))
    print_uncut(make_console(), table)
    return table


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a conf/model option (default: gpt_1_3b on CUDA, gpt_tiny on CPU)")
    parser.add_argument("--checkpoint", default=None, help="a run dir, checkpoint or export to load instead of --model")
    parser.add_argument("--vocab-size", type=int, default=None, help="for --model (default: 50304 for gpt_1_3b, else 320)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--impls", nargs="+", default=list(IMPLS))
    parser.add_argument("--hbm-gbps", type=float, default=None,
                        help="device memory bandwidth in GB/s (default: detected for H100 SXM 3350, H200 4800)")
    parser.add_argument("--out", default=None, help="folder for inference.csv/json/md (default: a temporary folder)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = DTYPES[args.dtype or ("bf16" if cuda else "fp32")]
    if args.checkpoint:
        model, _ = load_model(args.checkpoint)
        name = args.checkpoint
    else:
        name = args.model or ("gpt_1_3b" if cuda else "gpt_tiny")
        model = model_from_name(name, args.vocab_size or (50304 if name == "gpt_1_3b" else 320), None)
    if not cuda:
        torch.set_num_threads(max(1, torch.get_num_threads()))
    hbm_gbps = args.hbm_gbps or (known_hbm_gbps(torch.cuda.get_device_name()) if cuda else None)
    rows = run_benchmark(model, args.batch, args.prompt_len, args.new_tokens, dtype, device, args.repeats,
                         args.impls, hbm_gbps)
    table = print_table(rows, f"inference: {name} ({model.num_params() / 1e6:.1f}M params), {device}, "
                              f"{str(dtype).replace('torch.', '')}, prompt {args.prompt_len}, {args.new_tokens} new tokens")
    out = Path(args.out or tempfile.mkdtemp(prefix="dsrecipes_bench_"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {write_rows(out, 'inference', rows, table, DECODE_CHART)}")
    return rows


def serve_bench(model, g, device, run_dir: str, say, source: str, rank: int = 0) -> dict:
    """`python -m dsrecipes mode=serve-bench`: this benchmark on the recipe's model (g: the generate
    group); rank 0 prints its table and writes it to <run_dir>/serve_bench.csv, .json, .md and .png."""

    dtype = DTYPES.get(g.dtype, torch.float32)
    prompt_len = min(g.bench_prompt_len, model.cfg.max_seq_len - g.bench_new_tokens)
    rows = run_benchmark(model, list(g.bench_batch_sizes), prompt_len, g.bench_new_tokens, dtype, str(device),
                         g.bench_repeats, list(g.bench_impls))
    if rank == 0:
        table = print_table(rows, f"serve-bench: {source}, {device}, {g.dtype}, prompt {prompt_len}, "
                                  f"{g.bench_new_tokens} new tokens")
        out = Path(run_dir)
        out.mkdir(parents=True, exist_ok=True)
        say(f"wrote {write_rows(out, 'serve_bench', rows, table, DECODE_CHART)} (and .json, .md, .png)")
    return {"serve_bench": rows}


if __name__ == "__main__":
    main()
