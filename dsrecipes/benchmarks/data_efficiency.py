"""Data efficiency, measured: baseline vs curriculum vs random-LTD vs both, on the built-in corpus.

    python -m dsrecipes.benchmarks.data_efficiency                     # gpt_debug, 240 steps per variant, CPU
    python -m dsrecipes.benchmarks.data_efficiency --steps 600 --model gpt_tiny --out bench/
    python -m dsrecipes.benchmarks.data_efficiency --target 2.6        # a fixed validation-loss target

Every variant is the same recipe (model, data, optimizer, LR schedule, seed, step budget) with another
`data_efficiency` option, trained in-process by the real Trainer. Two comparisons:

* same step budget: final validation loss, tokens and layer-tokens consumed (layer-tokens = tokens times
  the layers they went through: what the transformer blocks' compute scales with), train wall time;
* same validation-loss target (default: the baseline's final validation loss): the first evaluation at or
  below it, and the tokens / layer-tokens / train seconds spent to get there.

The schedules reach full length at half the step budget (--ramp). Writes data_efficiency.csv/.json/.md/.png to --out.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dsrecipes.benchmarks.results import BarChart, write_rows
from dsrecipes.utils.console import make_console
from dsrecipes.utils.console import print_table as print_uncut

VARIANTS = {
    "baseline": ["data_efficiency=none"],
    "seqlen_curriculum": ["data_efficiency=seqlen_curriculum"],
    "random_ltd": ["data_efficiency=random_ltd"],
    "curriculum+random_ltd": ["data_efficiency=combined"],
}


def base_overrides(args) -> list[str]:
    ramp = args.ramp or args.steps // 2
    return [
        f"model={args.model}", f"model.max_seq_len={args.seq}", f"data.max_bytes={args.max_bytes}",
        f"trainer.max_steps={args.steps}",
        f"trainer.train_micro_batch_size_per_gpu={args.micro_batch}", f"trainer.eval_interval={args.eval_interval}",
        f"trainer.log_interval={args.eval_interval}", f"trainer.eval_batches={args.eval_batches}",
        "trainer.sample_tokens=0", "trainer.progress_bar=false", "logger=jsonl", "checkpoint.save_final=false",
        "checkpoint.export_safetensors=false", f"lr_scheduler.warmup_num_steps={max(1, args.steps // 10)}",
        f"data_efficiency.curriculum_learning.total_curriculum_step={ramp}",
        f"data_efficiency.curriculum_learning.min_difficulty={args.min_seqlen}",
        f"data_efficiency.random_ltd.require_steps={ramp}", f"data_efficiency.random_ltd.min_value={args.min_kept}",
    ] + (["data.cache_dir=" + args.cache_dir] if args.cache_dir else [])


def run_variant(overrides: list[str], run_dir: Path) -> dict:
    """Train one variant; returns its per-evaluation curve and summary."""
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose
    from dsrecipes.training.trainer import Trainer

    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    summary = Trainer(root, run_dir, batch, overrides=overrides, console=make_console(quiet=True)).fit()
    by_step: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record)
    tokens_per_step = batch.train_batch_size * root.data.block_size
    n_layer = root.model.n_layer
    curve, train_s = [], 0.0
    for step in sorted(by_step):
        rec = by_step[step]
        if "perf/step_time_s" in rec:
            train_s += rec["perf/step_time_s"] * root.trainer.log_interval
        if "val/loss" not in rec:
            continue
        tokens = rec.get("data/consumed_tokens", step * tokens_per_step)  # baseline: no accounting callback
        layer_tokens = rec.get("data/consumed_layer_tokens", step * tokens_per_step * n_layer)
        curve.append({"step": step, "val_loss": rec["val/loss"], "tokens": tokens, "layer_tokens": layer_tokens,
                      "train_s": train_s})
    return {"curve": curve, "summary": summary["metrics"], "n_layer": n_layer}


def compare(results: dict[str, dict], target: float | None) -> tuple[list[dict], float]:
    """One row per variant: same-budget figures and cost to reach the validation-loss target."""
    base = results["baseline"]["curve"]
    target = target if target is not None else base[-1]["val_loss"]
    base_last = base[-1]
    base_hit = next((p for p in base if p["val_loss"] <= target), None)
    rows = []
    for name, result in results.items():
        last = result["curve"][-1]
        hit = next((p for p in result["curve"] if p["val_loss"] <= target), None)
        row = {
            "variant": name,
            "final_val_loss": round(last["val_loss"], 4),
            "tokens": last["tokens"],
            "layer_tokens": last["layer_tokens"],
            "layer_tokens_vs_baseline": round(last["layer_tokens"] / base_last["layer_tokens"], 3),
            "train_s": round(last["train_s"], 1),
            "target_val_loss": round(target, 4),
            "steps_to_target": hit["step"] if hit else None,
            "tokens_to_target": hit["tokens"] if hit else None,
            "layer_tokens_to_target": hit["layer_tokens"] if hit else None,
            "layer_tokens_to_target_vs_baseline": (round(hit["layer_tokens"] / base_hit["layer_tokens"], 3)
                                                   if hit and base_hit else None),
            "train_s_to_target": round(hit["train_s"], 1) if hit else None,
        }
        rows.append(row)
    return rows, target


def print_table(rows: list[dict], console: Console, title: str) -> Table:
    """The comparison as a rich Table, printed uncut on `console`; returns the table."""
    table = Table(title=title)
    columns = ["variant", "final_val_loss", "layer_tokens_vs_baseline", "train_s", "steps_to_target",
               "tokens_to_target", "layer_tokens_to_target_vs_baseline", "train_s_to_target"]
    for column in columns:
        table.add_column(column, justify="left" if column == "variant" else "right")
    for row in rows:
        table.add_row(*["-" if row[c] is None else (f"{row[c]:,}" if isinstance(row[c], int) else str(row[c]))
                        for c in columns])
    print_uncut(console, table)
    return table


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt_debug")
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--seq", type=int, default=128, help="context length = block size")
    parser.add_argument("--ramp", type=int, default=None, help="steps to full length (default: steps/2)")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--eval-interval", type=int, default=20)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--min-seqlen", type=int, default=16, help="curriculum start length")
    parser.add_argument("--min-kept", type=int, default=32, help="random-LTD start length")
    parser.add_argument("--max-bytes", type=int, default=2_000_000)
    parser.add_argument("--target", type=float, default=None, help="validation-loss target (default: baseline's final)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    if "baseline" not in args.variants:
        args.variants = ["baseline", *args.variants]
    console = make_console()
    base = base_overrides(args)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.variants:
            console.print(f"[bold]{name}[/]: training {args.steps} steps ...")
            results[name] = run_variant(base + VARIANTS[name], Path(tmp) / name)
    rows, target = compare(results, args.target)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = print_table(rows, console, f"data efficiency: {args.model}, {args.steps} steps, target val loss {target:.4f}")
    chart = BarChart(table.title, "final validation loss", {"final_val_loss": ""}, labels=("variant",), better="min")
    write_rows(out, "data_efficiency", rows, table, chart)
    return rows


if __name__ == "__main__":
    main()
