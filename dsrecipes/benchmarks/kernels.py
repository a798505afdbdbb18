"""Kernel micro-benchmarks: every dsrecipes.kernels Triton op against torch eager and torch.compile.

    python -m dsrecipes.benchmarks.kernels --dtype bf16 --out bench/kernels            # all ops, on a GPU
    python -m dsrecipes.benchmarks.kernels --ops layer_norm rms_norm flash_attention --out bench/kernels
    python -m dsrecipes.benchmarks.kernels --quick                                    # small shapes (GPU or CPU smoke)

For each op at LLM shapes (norms and activations over 8192 tokens of a 4096-wide model, attention
B=2 H=16 T=4096 D=128 causal, cross entropy N=8192 V=128256, AdamW over a GPT-1.3B-like list of
tensors, int8 weight-only matmul M=16 and M=4096 with K=N=4096) it times, with
triton.testing.do_bench (median), the forward, the backward and forward+backward (where the op has a
gradient) of three implementations:

  * triton   the dsrecipes.kernels public function;
  * eager    torch's own op where one exists (F.layer_norm, F.rms_norm, SDPA, F.cross_entropy on
             fp32-upcast logits, torch.optim.AdamW(foreach=True), dequantize + matmul), else the
             op's pure-torch `<op>_reference`;
  * compile  torch.compile of the eager version;

plus, for some ops, one extra baseline (AdamW(fused=True); a dense matmul with an unquantized weight).
Memory-bound ops report GB/s (nominal minimum bytes read + written / time); attention and matmuls
report TFLOP/s (model FLOPs: causal attention counts half the square, backward = 2.5 x forward).
Peak memory is torch.cuda.max_memory_allocated over one call (reset before it), inputs included.
Speedups are eager_ms / triton_ms and compile_ms / triton_ms (> 1: the Triton op is faster).

Writes kernels.csv, kernels.json, kernels.md and kernels.png to --out (one row per op, shape and pass) and prints
a rich table. Without CUDA the benchmarks cannot run (Triton needs a GPU): the script says so and
exits 0; with --quick it then runs a tiny CPU smoke of every case (the reference vs eager, timed
with torch.utils.benchmark, no torch.compile, no Triton kernels) so the code paths are exercised.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from dsrecipes.benchmarks.results import BarChart, write_chart
from dsrecipes.utils.console import make_console
from dsrecipes.utils.console import print_table as print_uncut
from dsrecipes.utils.dtypes import DTYPES
from dsrecipes.utils.tables import write_csv, write_table

GPU_NEEDED = ("dsrecipes.benchmarks.kernels: no CUDA device: the kernel benchmarks need a GPU "
              "(Triton kernels, do_bench, torch.compile).")
# Implementations, in column order. On a GPU the subject is "triton"; on the CPU smoke "reference".
IMPLS = ("triton", "reference", "eager", "compile", "torch_fused", "dense_matmul")
GRAD_PASSES = ("fwd", "bwd", "fwd+bwd")


@dataclass
class Bench:
    """One benchmark case: inputs, the implementations (called as fn(*inputs)) and the nominal work."""

    op: str
    shape: str
    inputs: tuple = ()
    triton: Callable | None = None
    reference: Callable | None = None
    eager: Callable | None = None
    compile_target: Callable | None = None  # what torch.compile wraps (default: eager)
    extras: dict[str, Callable] = field(default_factory=dict)
    passes: tuple[str, ...] = GRAD_PASSES
    bytes: dict[str, float] = field(default_factory=dict)  # pass -> bytes moved (nominal minimum)
    flops: dict[str, float] = field(default_factory=dict)  # pass -> FLOPs


@dataclass
class Ctx:
    device: torch.device
    dtype: torch.dtype
    quick: bool

    @property
    def esize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def randn(self, *shape, grad: bool = False, dtype=None, scale: float = 1.0) -> torch.Tensor:
        t = torch.randn(*shape, device=self.device, dtype=dtype or self.dtype) * scale
        return t.requires_grad_(grad)


def _per_pass(fwd: float, bwd: float) -> dict[str, float]:
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}


# --------------------------------------------------------------------------------------------------
# Cases: one small function per op, returning its Bench list (quick: tiny shapes)
# --------------------------------------------------------------------------------------------------


def case_layer_norm(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.layer_norm import layer_norm, layer_norm_reference

    m, n = (64, 256) if c.quick else (8192, 4096)
    x, w, b = c.randn(m, n, grad=True), c.randn(n, grad=True), c.randn(n, grad=True)
    e = c.esize
    return [Bench("layer_norm", f"x[{m},{n}]", (x, w, b), triton=layer_norm, reference=layer_norm_reference,
                  eager=lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
                  bytes=_per_pass(2 * m * n * e, 3 * m * n * e))]


def case_rms_norm(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.rms_norm import rms_norm, rms_norm_reference

    m, n = (64, 256) if c.quick else (8192, 4096)
    x, w = c.randn(m, n, grad=True), c.randn(n, grad=True)
    e = c.esize
    return [Bench("rms_norm", f"x[{m},{n}]", (x, w), triton=rms_norm, reference=rms_norm_reference,
                  eager=lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps=1e-5),
                  bytes=_per_pass(2 * m * n * e, 3 * m * n * e))]


def case_bias_gelu(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.activations import bias_gelu, bias_gelu_reference

    m, n = (64, 256) if c.quick else (8192, 16384)
    x, b = c.randn(m, n, grad=True), c.randn(n, grad=True)
    e = c.esize
    return [Bench("bias_gelu", f"x[{m},{n}]", (x, b), triton=bias_gelu, reference=bias_gelu_reference,
                  eager=lambda x, b: F.gelu(x + b, approximate="tanh"),
                  bytes=_per_pass(2 * m * n * e, 3 * m * n * e))]


def case_swiglu(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.activations import swiglu, swiglu_reference

    m, f = (64, 256) if c.quick else (8192, 14336)
    g, u = c.randn(m, f, grad=True), c.randn(m, f, grad=True)
    e = c.esize
    return [Bench("swiglu", f"gate,up[{m},{f}]", (g, u), triton=swiglu, reference=swiglu_reference,
                  eager=lambda g, u: F.silu(g) * u, bytes=_per_pass(3 * m * f * e, 5 * m * f * e))]


def case_rope(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.rope import rope, rope_reference

    b, h, t, d = (1, 2, 32, 64) if c.quick else (2, 32, 4096, 128)
    x = c.randn(b, h, t, d, grad=True)
    ang = torch.arange(t, device=c.device, dtype=torch.float32)[:, None] * torch.rand(d // 2, device=c.device)
    cos, sin = ang.cos(), ang.sin()
    nbytes = 2 * x.numel() * c.esize
    return [Bench("rope", f"x[{b},{h},{t},{d}]", (x, cos, sin), triton=rope, reference=rope_reference,
                  eager=rope_reference, bytes=_per_pass(nbytes, nbytes))]


def case_softmax(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.softmax import softmax, softmax_reference

    b, h, t = (1, 2, 32) if c.quick else (1, 16, 4096)
    x = c.randn(b, h, t, t, grad=True)
    masked = torch.ones(t, t, dtype=torch.bool, device=c.device).triu(1)
    e = c.esize
    return [Bench("softmax", f"causal scores[{b},{h},{t},{t}]", (x,),
                  triton=lambda x: softmax(x, causal=True), reference=lambda x: softmax_reference(x, causal=True),
                  eager=lambda x: torch.softmax(x.masked_fill(masked, float("-inf")), dim=-1),
                  bytes=_per_pass(2 * x.numel() * e, 3 * x.numel() * e))]


def case_flash_attention(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.flash_attention import flash_attention, flash_attention_reference

    b, h, t, d = (1, 2, 64, 64) if c.quick else (2, 16, 4096, 128)
    q, k, v = (c.randn(b, h, t, d, grad=True) for _ in range(3))
    fwd = 4 * b * h * t * t * d / 2  # two matmuls, causal: half the score matrix
    return [Bench("flash_attention", f"q,k,v[{b},{h},{t},{d}] causal", (q, k, v),
                  triton=lambda q, k, v: flash_attention(q, k, v, causal=True),
                  reference=lambda q, k, v: flash_attention_reference(q, k, v, causal=True),
                  eager=lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                  flops=_per_pass(fwd, 2.5 * fwd))]


def case_cross_entropy(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.cross_entropy import cross_entropy, cross_entropy_reference

    n, v = (64, 1000) if c.quick else (8192, 128256)
    logits = c.randn(n, v, grad=True)
    tgt = torch.randint(0, v, (n,), device=c.device)
    e = c.esize
    return [Bench("cross_entropy", f"logits[{n},{v}]", (logits, tgt), triton=cross_entropy,
                  reference=cross_entropy_reference, eager=lambda x, t: F.cross_entropy(x.float(), t),
                  bytes=_per_pass(n * v * e, 2 * n * v * e))]


def case_fused_linear_cross_entropy(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.cross_entropy import fused_linear_cross_entropy, fused_linear_cross_entropy_reference

    n, d, v = (64, 64, 1000) if c.quick else (8192, 4096, 128256)
    hidden, weight = c.randn(n, d, grad=True), c.randn(v, d, grad=True, scale=d ** -0.5)
    tgt = torch.randint(0, v, (n,), device=c.device)
    mm = 2 * n * d * v
    return [Bench("fused_linear_cross_entropy", f"hidden[{n},{d}] weight[{v},{d}]", (hidden, weight, tgt),
                  triton=fused_linear_cross_entropy, reference=fused_linear_cross_entropy_reference,
                  eager=lambda h, w, t: F.cross_entropy((h @ w.t()).float(), t), flops=_per_pass(mm, 2 * mm))]


def _adamw_shapes(c: Ctx) -> tuple[list[tuple[int, ...]], str]:
    """A GPT-1.3B-like parameter list (24 layers, d=2048, vocab 50304), fewer layers if memory is short."""
    if c.quick:
        return [(64, 32), (32,), (128, 32)] * 2, "6 tensors"
    d, vocab = 2048, 50304
    layer = [(3 * d, d), (3 * d,), (d, d), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,), (d,), (d,), (d,), (d,)]
    per_layer, embed = sum(math.prod(s) for s in layer), vocab * d
    layers = 24
    if c.device.type == "cuda":  # p + g + one optimizer's two moments at a time: 16 bytes/param, with headroom
        free = torch.cuda.mem_get_info(c.device)[0]
        while layers > 1 and 16 * (layers * per_layer + embed) * 1.5 > free:
            layers //= 2
    shapes = [(vocab, d)] + layer * layers
    total = sum(math.prod(s) for s in shapes)
    return shapes, f"{len(shapes)} tensors, {total / 1e9:.2f}B params ({layers} layers)"


def case_fused_adamw(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.fused_adamw import fused_adamw_reference, fused_adamw_step

    shapes, desc = _adamw_shapes(c)
    params = [torch.randn(s, device=c.device, dtype=torch.float32, requires_grad=True) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)

    def functional(fn):  # lazily allocated moments, freed with the closure
        state: list = []

        def step():
            if not state:
                state.extend(([torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]))
            fn(params, [p.grad for p in params], state[0], state[1], step=10, **hyper)
        step.release = state.clear
        return step

    def torch_opt(**kw):
        opt: list = []

        def step():
            if not opt:
                opt.append(torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **kw))
            opt[0].step()
        step.release = opt.clear
        return step

    n = sum(p.numel() for p in params)
    return [Bench("fused_adamw", desc, (), triton=functional(fused_adamw_step),
                  reference=functional(fused_adamw_reference), eager=torch_opt(foreach=True),
                  compile_target=torch_opt(foreach=True), passes=("step",),
                  extras={"torch_fused": torch_opt(fused=True)} if c.device.type == "cuda" else {},
                  bytes={"step": 28 * n})]  # read p, g, m, v and write p, m, v, all fp32


def _int8_weight(c: Ctx, n: int, k: int):
    from dsrecipes.kernels.quantization import quantize_int8_reference

    return quantize_int8_reference(torch.randn(n, k, device=c.device, dtype=torch.float32))


def case_quantize_int8(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.quantization import quantize_int8, quantize_int8_reference

    n, k = (128, 256) if c.quick else (14336, 4096)
    w = c.randn(n, k)
    return [Bench("quantize_int8", f"w[{n},{k}] per channel", (w,), triton=quantize_int8,
                  reference=quantize_int8_reference, eager=quantize_int8_reference, passes=("fwd",),
                  bytes={"fwd": n * k * (c.esize + 1)})]


def case_dequantize_int8(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.quantization import dequantize_int8, dequantize_int8_reference

    n, k = (128, 256) if c.quick else (14336, 4096)
    q, scale, _ = _int8_weight(c, n, k)
    dt = c.dtype
    return [Bench("dequantize_int8", f"q[{n},{k}] per channel", (q, scale),
                  triton=lambda q, s: dequantize_int8(q, s, dtype=dt),
                  reference=lambda q, s: dequantize_int8_reference(q, s, dtype=dt),
                  eager=lambda q, s: q.to(dt) * s.to(dt), passes=("fwd",), bytes={"fwd": n * k * (1 + c.esize)})]


def case_int8_matmul(c: Ctx) -> list[Bench]:
    from dsrecipes.kernels.int8_matmul import int8_weight_only_matmul, int8_weight_only_matmul_reference

    k = n = 256 if c.quick else 4096
    q, scale, _ = _int8_weight(c, n, k)
    w_dense = (q.float() * scale).to(c.dtype)
    out = []
    for m in ((4, 64) if c.quick else (16, 4096)):
        x = c.randn(m, k)
        out.append(Bench("int8_matmul", f"x[{m},{k}] q[{n},{k}]", (x, q, scale),
                         triton=int8_weight_only_matmul, reference=int8_weight_only_matmul_reference,
                         eager=lambda x, q, s: x @ (q.to(x.dtype) * s.to(x.dtype)).t(),
                         extras={"dense_matmul": lambda x, q, s, w=w_dense: x @ w.t()}, passes=("fwd",),
                         flops={"fwd": 2 * m * n * k}, bytes={"fwd": n * k + (m * k + m * n) * c.esize}))
    return out


CASES: dict[str, Callable[[Ctx], list[Bench]]] = {
    "layer_norm": case_layer_norm,
    "rms_norm": case_rms_norm,
    "bias_gelu": case_bias_gelu,
    "swiglu": case_swiglu,
    "rope": case_rope,
    "softmax": case_softmax,
    "flash_attention": case_flash_attention,
    "cross_entropy": case_cross_entropy,
    "fused_linear_cross_entropy": case_fused_linear_cross_entropy,
    "fused_adamw": case_fused_adamw,
    "quantize_int8": case_quantize_int8,
    "dequantize_int8": case_dequantize_int8,
    "int8_matmul": case_int8_matmul,
}


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _pass_fn(fn: Callable, inputs: tuple, pass_: str):
    """A zero-argument callable running `pass_` of fn on inputs (for bwd: the graph is built once here)."""
    if pass_ in ("fwd", "step"):
        return lambda: fn(*inputs)
    out = _first(fn(*inputs))
    dy = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)
    if pass_ == "bwd":
        return lambda: out.backward(dy, retain_graph=True)
    out = None  # free this graph: fwd+bwd builds its own each call
    return lambda: _first(fn(*inputs)).backward(dy)


def _time_ms(run: Callable, grads: list, c: Ctx) -> float:
    if c.device.type == "cuda":
        import triton.testing

        warmup, rep = (5, 20) if c.quick else (25, 100)
        return float(triton.testing.do_bench(run, warmup=warmup, rep=rep, grad_to_none=grads or None,
                                             return_mode="median"))
    from torch.utils.benchmark import Timer

    def step():
        for g in grads:
            g.grad = None
        run()
    return Timer(stmt="step()", globals={"step": step}).timeit(3).median * 1e3


def _peak_mib(run: Callable, c: Ctx) -> float | None:
    if c.device.type != "cuda":
        return None
    torch.cuda.synchronize(c.device)
    torch.cuda.reset_peak_memory_stats(c.device)
    run()
    torch.cuda.synchronize(c.device)
    return torch.cuda.max_memory_allocated(c.device) / 2**20


def measure(fn: Callable, bench: Bench, pass_: str, c: Ctx) -> dict:
    """{"ms", "gbps", "tflops", "peak_mib"} for one implementation and pass, or {"error"}."""
    grads = [t for t in bench.inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    try:
        run = _pass_fn(fn, bench.inputs, pass_)
        run()  # warm-up (and compilation for torch.compile)
        if c.device.type == "cuda":
            torch.cuda.synchronize(c.device)
        peak = _peak_mib(run, c)
        ms = _time_ms(run, grads, c)
    except Exception as exc:  # a failing implementation is reported, the others still run
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
    finally:
        for g in grads:
            g.grad = None
    res = {"ms": ms, "peak_mib": peak}
    if pass_ in bench.bytes:
        res["gbps"] = bench.bytes[pass_] / (ms * 1e-3) / 1e9
    if pass_ in bench.flops:
        res["tflops"] = bench.flops[pass_] / (ms * 1e-3) / 1e12
    return res


def implementations(bench: Bench, c: Ctx, use_compile: bool) -> dict[str, Callable]:
    if c.device.type != "cuda":  # CPU smoke: no Triton kernels, no compile
        return {"reference": bench.reference, "eager": bench.eager}
    impls = {"triton": bench.triton, "eager": bench.eager}
    if use_compile:
        impls["compile"] = torch.compile(bench.compile_target or bench.eager, dynamic=False)
    impls.update(bench.extras)
    return impls


def run_bench(bench: Bench, c: Ctx, use_compile: bool) -> list[dict]:
    subject = "triton" if c.device.type == "cuda" else "reference"
    results: dict[str, dict[str, dict]] = {p: {} for p in bench.passes}
    impls = implementations(bench, c, use_compile)
    for name in list(impls):
        fn = impls.pop(name)
        for p in bench.passes:
            results[p][name] = measure(fn, bench, p, c)
        raw = (bench.compile_target or bench.eager) if name == "compile" else fn
        getattr(raw, "release", lambda: None)()  # e.g. an optimizer's moments: one set alive at a time
        del fn, raw
        if name == "compile":
            torch._dynamo.reset()  # drop the compiled graphs (and what their guards hold)
        gc.collect()
        if c.device.type == "cuda":
            torch.cuda.empty_cache()
    rows = []
    for p in bench.passes:
        row = {"op": bench.op, "shape": bench.shape, "dtype": str(c.dtype).replace("torch.", ""), "pass": p,
               "device": c.device.type, "subject": subject,
               "metric": "TFLOP/s" if p in bench.flops else ("GB/s" if p in bench.bytes else "")}
        for name in IMPLS:
            r = results[p].get(name, {})
            for key in ("ms", "gbps", "tflops", "peak_mib", "error"):
                row[f"{name}_{key}"] = r.get(key)
        base = row[f"{subject}_ms"]
        for other in ("eager", "compile"):
            row[f"speedup_vs_{other}"] = row[f"{other}_ms"] / base if base and row[f"{other}_ms"] else None
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def _fmt(v, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _throughput(row: dict, name: str) -> str:
    key, spec = ("tflops", ".1f") if row["metric"] == "TFLOP/s" else ("gbps", ".0f")
    value = row.get(f"{name}_{key}")
    return "-" if value is None else f"{value:{spec}} {row['metric']}"


def _summary(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the printed / markdown table (the CSV and JSON carry every field)."""
    s = rows[0]["subject"] if rows else "triton"
    head = ["op", "shape", "pass", f"{s} ms", "eager ms", "compile ms", s, "eager", "compile",
            "x vs eager", "x vs compile", f"peak MiB {s}/eager/compile", "other"]
    body = []
    for r in rows:
        other = [f"{n} {_fmt(r[f'{n}_ms'])} ms" for n in ("torch_fused", "dense_matmul") if r[f"{n}_ms"] is not None]
        other += [f"{n}: {r[f'{n}_error']}" for n in IMPLS if r[f"{n}_error"]]
        peaks = "/".join(_fmt(r[f"{n}_peak_mib"], ".0f") for n in (s, "eager", "compile"))
        body.append([r["op"], r["shape"], r["pass"], _fmt(r[f"{s}_ms"]), _fmt(r["eager_ms"]), _fmt(r["compile_ms"]),
                     _throughput(r, s), _throughput(r, "eager"), _throughput(r, "compile"),
                     _fmt(r["speedup_vs_eager"], ".2f"), _fmt(r["speedup_vs_compile"], ".2f"), peaks,
                     "; ".join(other)])
    return head, body


def write_outputs(rows: list[dict], meta: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fields = list(rows[0]) if rows else ["op"]
    write_csv(out / "kernels.csv", rows, fields)
    (out / "kernels.json").write_text(json.dumps({**meta, "rows": rows}, indent=2))
    write_table(results_table(rows, meta), out / "kernels.md")
    subject = rows[0]["subject"] if rows else "triton"
    write_chart(out, "kernels", rows, BarChart(f"dsrecipes.kernels on {meta['device_name']}: eager ms / {subject} ms",
                                               "speed-up vs torch eager", {"speedup_vs_eager": ""},
                                               labels=("op", "shape", "pass")))


def results_table(rows: list[dict], meta: dict):
    """The printed / markdown table as a rich Table (the CSV and JSON carry every field)."""
    from rich.table import Table

    head, body = _summary(rows)
    table = Table(title=f"dsrecipes.kernels on {meta['device_name']} ({meta['dtype']}); x = baseline ms / "
                        f"{rows[0]['subject'] if rows else 'triton'} ms")
    for i, column in enumerate(head):
        table.add_column(column, justify="left" if i < 3 or column == "other" else "right")
    for line in body:
        table.add_row(*line)
    return table


def print_table(rows: list[dict], meta: dict) -> None:
    print_uncut(make_console(), results_table(rows, meta))


def run_ops(ops: list[str], c: Ctx, use_compile: bool, deadline: float | None = None) -> tuple[list[dict], list[str]]:
    """(rows, ops not started): every case of each op in `ops`, in order; an op is not started once
    time.monotonic() has passed `deadline` (a caller's time budget, e.g. dsrecipes.benchmarks.gpu_suite)."""
    rows: list[dict] = []
    not_started: list[str] = []
    for op in ops:
        if deadline is not None and time.monotonic() > deadline:
            not_started.append(op)
            continue
        for bench in CASES[op](c):
            rows += run_bench(bench, c, use_compile=use_compile)
            del bench
            if c.device.type == "cuda":
                torch._dynamo.reset()
                gc.collect()
                torch.cuda.empty_cache()
    return rows, not_started


def run_meta(c: Ctx, dtype: str) -> dict:
    """The device, dtype and library versions a kernel table was measured with (kernels.json's header)."""
    cuda = c.device.type == "cuda"
    meta = {"device": c.device.type, "device_name": torch.cuda.get_device_name(c.device) if cuda else "cpu",
            "dtype": dtype, "quick": c.quick, "torch": torch.__version__}
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    return meta


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", nargs="+", default=list(CASES), choices=list(CASES), metavar="OP",
                        help=f"ops to run (default all): {' '.join(CASES)}")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--out", default=None, help="folder for kernels.csv/json/md (default: a temporary folder)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few repetitions (a smoke run)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available()
    if not cuda:
        print(GPU_NEEDED)
        if not args.quick:
            print("Run it on a CUDA machine, or pass --quick for a tiny CPU smoke of the code paths.")
            return []
        print("--quick: running a tiny CPU smoke instead (the reference vs eager, no Triton, no torch.compile).")
    c = Ctx(torch.device("cuda" if cuda else "cpu"), DTYPES[args.dtype], args.quick)
    torch.manual_seed(args.seed)
    rows, _ = run_ops(args.ops, c, use_compile=cuda and not args.no_compile)
    meta = run_meta(c, args.dtype)
    out = Path(args.out or tempfile.mkdtemp(prefix="dsrecipes_kernels_"))
    print_table(rows, meta)
    write_outputs(rows, meta, out)
    print(f"wrote {out / 'kernels.csv'}, {out / 'kernels.json'}, {out / 'kernels.md'} (and kernels.png)")
    return rows


if __name__ == "__main__":
    main()
