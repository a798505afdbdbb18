"""Training throughput of recipe variants, side by side: tokens/s, MFU, peak memory, ratios.

    python -m dsrecipes.benchmarks.train_throughput                       # gpt_tiny fp32 vs bf16, CPU or GPU
    python -m dsrecipes.benchmarks.train_throughput --model gpt2_124m --seq 1024 --micro-batch 16 \\
        --steps 60 --variants precision=fp32 precision=bf16 --out bench/

Each variant is the default recipe plus its overrides, trained in-process by the real Trainer for
--steps optimizer steps on the built-in corpus; throughput is the median of the logged windows after
the first (which includes start-up). A variant that fails (overrides that do not compose, e.g. a config
group this checkout lacks, or a run that errors) is a row with its error message; the others still run.
Writes throughput.csv, .json, .md (the table) and .png (tokens/s per variant) to --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

from rich.table import Table

from dsrecipes.benchmarks.results import BarChart, write_rows
from dsrecipes.utils.console import make_console, print_table


def run_variant(base: list[str], variant: str, run_dir: Path) -> dict:
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose
    from dsrecipes.training.extensions.base import Extensions
    from dsrecipes.training.trainer import Trainer

    overrides = base + variant.split()
    root, batch = validate_recipe(compose(overrides))
    Trainer(root, run_dir, batch, overrides=overrides, extensions=Extensions(), console=make_console(quiet=True)).fit()
    windows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    windows = [w for w in windows if "perf/tokens_per_s" in w][1:]
    if not windows:
        raise SystemExit("too few steps to measure: raise --steps (at least 2 log windows are needed)")

    def median(key):
        values = [w[key] for w in windows if key in w]
        return statistics.median(values) if values else None

    return {
        "variant": variant,
        "tokens_per_s": median("perf/tokens_per_s"),
        "step_time_s": median("perf/step_time_s"),
        "mfu": median("perf/mfu"),
        "peak_mem_gib": max((w.get("mem/peak_gib", 0.0) for w in windows), default=None) or None,
        "final_loss": windows[-1]["train/loss"],
    }


ROW_KEYS = ("variant", "status", "tokens_per_s", "step_time_s", "mfu", "peak_mem_gib", "final_loss", "speedup",
            "wall_s", "error")


def base_overrides(model: str, seq: int, micro_batch: int, steps: int, log_interval: int,
                   extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The overrides every variant shares: the model and batch shape, `steps` steps, no eval / samples /
    checkpoint / TensorBoard (only the throughput windows are wanted)."""
    return [
        f"model={model}", f"model.max_seq_len={seq}", f"trainer.max_steps={steps}",
        f"trainer.train_micro_batch_size_per_gpu={micro_batch}", f"trainer.log_interval={log_interval}",
        "trainer.eval_interval=0", "trainer.eval_batches=1", "trainer.sample_tokens=0", "trainer.progress_bar=false",
        "checkpoint.save_final=false", "logger.tensorboard=false", *extra,
    ]


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause).strip() and str(cause).strip() not in text:
        text += f" ({str(cause).strip()})"
    return f"{type(exc).__name__}: {' '.join(text.split())[:400]}"


def _release_device_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch._dynamo.reset()
        torch.cuda.empty_cache()


def run_variants(base: list[str], variants: list[str], out: Path, deadline: float | None = None) -> list[dict]:
    """One row per variant: run_variant's figures and status "ok", or status "failed" and the error (a variant
    whose overrides do not compose, or whose run raised), or status "skipped" once time.monotonic() is past
    `deadline`. speedup: tokens/s over the first measured variant's."""
    rows = []
    for i, variant in enumerate(variants):
        if deadline is not None and time.monotonic() > deadline:
            rows.append({"variant": variant, "status": "skipped", "error": "time budget spent before it started"})
            continue
        start = time.monotonic()
        try:
            row = {**run_variant(base, variant, out / f"run{i}"), "status": "ok", "error": None}
        except (Exception, SystemExit) as exc:  # a failed variant is a row; the others still run
            row = {"variant": variant, "status": "failed", "error": _error_text(exc)}
        row["wall_s"] = time.monotonic() - start
        rows.append(row)
        _release_device_memory()
    measured = [r for r in rows if r.get("tokens_per_s")]
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / measured[0]["tokens_per_s"] if measured and row.get("tokens_per_s") else None
    return [{key: row.get(key) for key in ROW_KEYS} for row in rows]  # the same columns on every row (CSV)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt_tiny")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--variants", nargs="+", default=["precision=fp32", "precision=bf16"],
                        help="each a space-separated list of overrides, e.g. 'precision=bf16 optimizer.impl=foreach'")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides applied to every variant")
    parser.add_argument("--out", default=None, help="folder for throughput.csv/json/md (default: a temporary folder)")
    args = parser.parse_args(argv)

    base = base_overrides(args.model, args.seq, args.micro_batch, args.steps, args.log_interval, args.extra)
    out = Path(args.out or tempfile.mkdtemp(prefix="dsrecipes_bench_"))
    out.mkdir(parents=True, exist_ok=True)
    rows = run_variants(base, args.variants, out)

    table = Table(title=f"training throughput: {args.model}, {args.micro_batch} x {args.seq} tokens/micro-batch")
    for column in ("variant", "tokens/s", "step s", "MFU", "peak GiB", "loss", "x vs first measured", "error"):
        table.add_column(column, justify="right")
    for r in rows:
        if r["status"] != "ok":
            table.add_row(r["variant"], "-", "-", "-", "-", "-", "-", f"{r['status']}: {r['error']}")
            continue
        table.add_row(
            r["variant"], f"{r['tokens_per_s']:,.0f}", f"{r['step_time_s']:.4f}",
            f"{r['mfu']:.1%}" if r["mfu"] else "-", f"{r['peak_mem_gib']:.2f}" if r["peak_mem_gib"] else "-",
            f"{r['final_loss']:.3f}", f"{r['speedup']:.2f}", "",
        )
    print_table(make_console(), table)
    chart = BarChart(table.title, "tokens/s", {"tokens_per_s": ""}, labels=("variant",))
    print(f"wrote {write_rows(out, 'throughput', rows, table, chart)} (and .json, .md, .png)")
    return rows


if __name__ == "__main__":
    main()
