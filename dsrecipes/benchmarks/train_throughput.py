"""Training throughput of recipe variants, side by side: tokens/s, MFU, peak memory, ratios.

    python -m dsrecipes.benchmarks.train_throughput                       # gpt_tiny fp32 vs bf16, CPU or GPU
    python -m dsrecipes.benchmarks.train_throughput --model gpt2_124m --seq 1024 --micro-batch 16 \\
        --steps 60 --variants precision=fp32 precision=bf16 --out bench/

Each variant is the default recipe plus its overrides, trained in-process by the real Trainer for
--steps optimizer steps on the built-in corpus; throughput is the median of the logged windows after
the first (which includes start-up). Writes throughput.csv, .json, .md (the table) and .png (tokens/s per variant) to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from rich.table import Table

from dsrecipes.benchmarks.results import BarChart, write_rows
from dsrecipes.utils.console import make_console, print_table


def run_variant(base: list[str], variant: str, run_dir: Path) -> dict:
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose
    from dsrecipes.training.extensions import Extensions
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

    base = [
        f"model={args.model}", f"model.max_seq_len={args.seq}", f"trainer.max_steps={args.steps}",
        f"trainer.train_micro_batch_size_per_gpu={args.micro_batch}", f"trainer.log_interval={args.log_interval}",
        "trainer.eval_interval=0", "trainer.eval_batches=1", "trainer.sample_tokens=0", "trainer.progress_bar=false",
        "checkpoint.save_final=false", "logger.tensorboard=false", *args.extra,
    ]
    out = Path(args.out or tempfile.mkdtemp(prefix="dsrecipes_bench_"))
    out.mkdir(parents=True, exist_ok=True)
    rows = [run_variant(base, v, out / f"run{i}") for i, v in enumerate(args.variants)]
    baseline = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / baseline

    table = Table(title=f"training throughput: {args.model}, {args.micro_batch} x {args.seq} tokens/micro-batch")
    for column in ("variant", "tokens/s", "step s", "MFU", "peak GiB", "loss", f"x vs {args.variants[0]}"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            r["variant"], f"{r['tokens_per_s']:,.0f}", f"{r['step_time_s']:.4f}",
            f"{r['mfu']:.1%}" if r["mfu"] else "-", f"{r['peak_mem_gib']:.2f}" if r["peak_mem_gib"] else "-",
            f"{r['final_loss']:.3f}", f"{r['speedup']:.2f}",
        )
    print_table(make_console(), table)
    chart = BarChart(table.title, "tokens/s", {"tokens_per_s": ""}, labels=("variant",))
    print(f"wrote {write_rows(out, 'throughput', rows, table, chart)} (and .json, .md, .png)")
    return rows


if __name__ == "__main__":
    main()
