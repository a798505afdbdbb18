"""Optimizers side by side: validation loss after the same steps, and optimizer-state bytes per parameter.

    python -m dsrecipes.benchmarks.optimizers                          # the default recipe (gpt_tiny), 200 steps
    python -m dsrecipes.benchmarks.optimizers --steps 400 --out bench/
    python -m dsrecipes.benchmarks.optimizers --variants adamw,muon --model gpt_debug --steps 40

Every variant is the same recipe (model, data, LR schedule, seed, batches) with another `optimizer` choice, trained
in-process by the real Trainer: AdamW with fp32 state (the baseline), AdamW with bf16 state
(optimizer.state_dtype=bf16, stochastically rounded moments), torchao's 8-bit AdamW (optimizer=adamw8bit; reported
as not run where torchao is not installed) and Muon (optimizer=muon, its defaults: update_scale=match_adamw_rms, so
AdamW's lr and weight decay carry over). Reported per variant: the final validation loss and its ratio to the
baseline's (target: within 2%), the bytes the optimizer's state tensors hold after training (every tensor in
optimizer.state, counted per trained parameter: the measured figure, not the estimator's), its ratio to the
baseline's (targets: Muon <= 0.55, bf16 state <= 0.5, 8-bit <= 0.3), and the training seconds.
Writes optimizers.csv/.json/.md/.png to --out.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from rich.table import Table

from dsrecipes.benchmarks.results import BarChart, write_rows
from dsrecipes.training.optim.state_bytes import held_state_bytes
from dsrecipes.utils.console import make_console, print_table

VARIANTS = {  # name -> (overrides, the state-bytes ratio target against adamw fp32)
    "adamw": (["optimizer=adamw"], None),
    "adamw_bf16_state": (["optimizer=adamw", "optimizer.state_dtype=bf16"], 0.5),
    "adamw8bit": (["optimizer=adamw8bit"], 0.3),
    "muon": (["optimizer=muon"], 0.55),
}
LOSS_TARGET = 0.02  # the final validation loss within 2% of AdamW fp32's


def available(name: str) -> str | None:
    """Why the variant cannot run here (None: it can)."""
    from dsrecipes.training.optim.optimizer_config import torchao_installed

    if name == "adamw8bit" and not torchao_installed():
        return "torchao is not installed (pip install 'dsrecipes[torchao]')"
    return None


def base_overrides(args) -> list[str]:
    return [
        f"model={args.model}", f"trainer.max_steps={args.steps}", f"trainer.eval_interval={args.steps}",
        f"trainer.log_interval={args.steps}", f"trainer.eval_batches={args.eval_batches}",
        f"trainer.train_micro_batch_size_per_gpu={args.micro_batch}", f"data.max_bytes={args.max_bytes}",
        "trainer.sample_tokens=0", "trainer.progress_bar=false", "logger=jsonl", "checkpoint.save_final=false",
        "checkpoint.export_safetensors=false", f"trainer.seed={args.seed}",
    ] + ([f"data.cache_dir={args.cache_dir}"] if args.cache_dir else [])


def run_variant(overrides: list[str], run_dir: Path) -> dict:
    """Train one variant in-process; its final validation loss, state bytes per trained parameter and seconds."""
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose
    from dsrecipes.training.trainer import Trainer

    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    trainer = Trainer(root, run_dir, batch, overrides=overrides, console=make_console(quiet=True))
    start = time.perf_counter()
    summary = trainer.fit()
    seconds = time.perf_counter() - start
    trained = sum(p.numel() for p in trainer.gpt.parameters() if p.requires_grad)
    held = held_state_bytes(trainer.engine.optimizer)
    return {"val_loss": summary["metrics"]["val/loss"], "state_bytes": held, "parameters": trained,
            "state_bytes_per_param": held / trained, "train_s": seconds}


def compare(results: dict[str, dict | str]) -> list[dict]:
    """One row per variant, with its ratios to adamw (fp32 state)."""
    base = results["adamw"]
    rows = []
    for name, result in results.items():
        target = VARIANTS[name][1]
        if isinstance(result, str):
            rows.append({"variant": name, "val_loss": None, "val_loss_vs_adamw": None, "state_bytes_per_param": None,
                         "state_vs_adamw": None, "state_target": target, "train_s": None, "note": result})
            continue
        loss_ratio = round(result["val_loss"] / base["val_loss"], 4)
        # as printed (3 decimals): otherwise the `step` counters both hold push an exact 0.5 just over
        state_ratio = round(result["state_bytes_per_param"] / base["state_bytes_per_param"], 3)
        met = [loss_ratio <= 1 + LOSS_TARGET] + ([state_ratio <= target] if target else [])
        rows.append({"variant": name, "val_loss": round(result["val_loss"], 4),
                     "val_loss_vs_adamw": loss_ratio,
                     "state_bytes_per_param": round(result["state_bytes_per_param"], 3),
                     "state_vs_adamw": state_ratio, "state_target": target,
                     "train_s": round(result["train_s"], 1), "note": "targets met" if all(met) else "target missed"})
    return rows


def table_of(rows: list[dict], title: str) -> Table:
    table = Table(title=title)
    columns = ("variant", "val_loss", "val_loss_vs_adamw", "state_bytes_per_param", "state_vs_adamw", "state_target",
               "train_s", "note")
    for column in columns:
        table.add_column(column, justify="left" if column in ("variant", "note") else "right")
    for row in rows:
        table.add_row(*["-" if row[c] is None else str(row[c]) for c in columns])
    table.caption = (f"val loss within {LOSS_TARGET:.0%} of adamw (fp32 state) or below it; state = bytes of the "
                     "optimizer's state tensors per trained parameter, measured after training")
    return table


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m dsrecipes.benchmarks.optimizers",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt_tiny", help="the model recipe (default: the default recipe's)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--eval-batches", type=int, default=16)
    parser.add_argument("--max-bytes", type=int, default=2_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    names = ["adamw", *[n for n in names if n != "adamw"]]  # the baseline always runs, first
    console = make_console()
    results: dict[str, dict | str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            reason = available(name)
            if reason:
                console.print(f"[bold]{name}[/]: not run: {reason}")
                results[name] = f"not run: {reason}"
                continue
            console.print(f"[bold]{name}[/]: training {args.steps} steps ...")
            results[name] = run_variant(base_overrides(args) + VARIANTS[name][0], Path(tmp) / name)
    rows = compare(results)
    device = "cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name()
    table = table_of(rows, f"optimizers: {args.model}, {args.steps} steps, micro-batch {args.micro_batch}, {device}")
    print_table(console, table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chart = BarChart(table.title, "optimizer-state bytes per parameter", {"state_bytes_per_param": ""},
                     labels=("variant",), better="min")
    write_rows(out, "optimizers", [r for r in rows if r["val_loss"] is not None], table, chart)
    return rows


if __name__ == "__main__":
    main()
