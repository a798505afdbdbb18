"""Communication efficiency, measured: bytes per optimizer step, tokens/s and final validation loss, side by side.

    python -m dsrecipes.benchmarks.communication                          # world 2 and 4, 400 steps, gpt_debug
    python -m dsrecipes.benchmarks.communication --world-size 2 --steps 60 --variants adamw onebitadam --out bench/

Every variant trains the same recipe (model, data, seed, learning-rate schedule, step budget, global batch)
through the real CLI (`python -m dsrecipes launcher.nproc_per_node=W comms_logger=enabled ...`, a subprocess
per run) and differs only in its optimizer or its ZeRO++ keys:

  optimizers (zero.stage=0):  adamw, onebitadam, zerooneadam (Adam family, compared with adamw),
                              lamb, onebitlamb (compared with lamb); the 1-bit optimizers freeze at
                              --freeze (default 25% of the steps). Each pair runs the same update
                              until the freeze (the Adam pair with bias correction, as torch's AdamW;
                              the LAMB pair without, as DeepSpeed's 1-bit LAMB), so compression is
                              the only difference
  ZeRO-3 (FSDP2):             zero3, +qwZ (quantized weight all-gather), +qgZ (quantized gradient
                              reduce-scatter), +hpZ (secondary partition of --hpz ranks, world > --hpz only),
                              zeropp (all three); compared with zero3

Bytes are what rank 0 sends into collectives, counted by the comms logger (`comm/bytes_per_step` in the
run's metrics.jsonl, per optimizer step; comms.json per op). For the 1-bit optimizers the figure is the
median over the logged steps after the freeze (the compression stage), beside the warm-up's. For ZeRO++
each row also gives the bytes of the collectives the option replaces: all-gather bytes (qwZ) and
reduce-scatter bytes (qgZ, whose quantized exchange is an all-to-all) against plain ZeRO-3's.

Targets (issue 20): after the freeze 1-bit Adam sends at most 1/20 of Adam's gradient bytes; qwZ and qgZ at
most 0.3x of the fp32 collective bytes they replace; over 400 steps (freeze at 25%) the compressed runs end
within 3% of the uncompressed validation loss. The table says, per row, which target applies and whether it
is met. Writes communication.csv/.json/.md/.png to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.table import Table

from dsrecipes.benchmarks.results import BarChart, write_rows
from dsrecipes.utils.console import make_console
from dsrecipes.utils.console import print_table as print_uncut

# name -> (overrides, baseline variant, kind): kind "onebit" compares the bytes after the freeze,
# "zeropp" the bytes of the replaced collectives.
VARIANTS: dict[str, tuple[list[str], str | None, str]] = {
    "adamw": (["optimizer=adamw", "zero.stage=0"], None, "baseline"),
    "onebitadam": (["optimizer=onebitadam", "optimizer.bias_correction=true", "zero.stage=0"], "adamw", "onebit"),
    "zerooneadam": (["optimizer=zerooneadam", "optimizer.bias_correction=true", "zero.stage=0"], "adamw", "onebit"),
    "lamb": (["optimizer=lamb", "optimizer.bias_correction=false", "zero.stage=0"], None, "baseline"),
    "onebitlamb": (["optimizer=onebitlamb", "zero.stage=0"], "lamb", "onebit"),
    "zero3": (["zero.stage=3"], None, "baseline"),
    "zero3+qwZ": (["zero.stage=3", "zero.zero_quantized_weights=true"], "zero3", "zeropp"),
    "zero3+qgZ": (["zero.stage=3", "zero.zero_quantized_gradients=true"], "zero3", "zeropp"),
    "zero3+hpZ": (["zero.stage=3"], "zero3", "zeropp"),  # + zero.zero_hpz_partition_size=--hpz
    "zeropp": (["zero.stage=3", "zero.zero_quantized_weights=true", "zero.zero_quantized_gradients=true"],
               "zero3", "zeropp"),  # + hpZ where the world allows it
}
ONEBIT_BYTES_TARGET = 1 / 20
ZEROPP_BYTES_TARGET = 0.3
LOSS_TARGET = 0.03
# which collectives each ZeRO++ option replaces (comms logger op names)
REPLACED_OPS = {"zero3+qwZ": ("all_gather",), "zero3+qgZ": ("reduce_scatter",)}


def freeze_overrides(name: str, freeze: int) -> list[str]:
    """The freeze keys of a 1-bit optimizer (DeepSpeed's names)."""
    if name == "zerooneadam":
        return [f"optimizer.var_freeze_step={freeze}"]
    if name in ("onebitadam", "onebitlamb"):
        return [f"optimizer.freeze_step={freeze}"]
    return []


def hpz_overrides(name: str, world: int, hpz: int) -> list[str] | None:
    """zero.zero_hpz_partition_size for the hpZ variants; None where the world has no smaller group."""
    if name not in ("zero3+hpZ", "zeropp"):
        return []
    if world <= hpz or world % hpz:
        return None if name == "zero3+hpZ" else []
    return [f"zero.zero_hpz_partition_size={hpz}"]


def base_overrides(args, world: int, run_dir: Path) -> list[str]:
    return [
        f"model={args.model}", f"model.max_seq_len={args.seq}", f"data.max_bytes={args.max_bytes}",
        f"trainer.max_steps={args.steps}", f"trainer.train_batch_size={args.global_batch}",
        f"trainer.train_micro_batch_size_per_gpu={args.global_batch // world}",
        f"trainer.log_interval={args.log_interval}", f"trainer.eval_interval={args.steps}",
        f"trainer.eval_batches={args.eval_batches}", f"launcher.nproc_per_node={world}",
        "comms_logger=enabled", "logger=jsonl", "trainer.sample_tokens=0", "trainer.progress_bar=false",
        "checkpoint.save_final=false", "checkpoint.export_safetensors=false", f"hydra.run.dir={run_dir}",
    ] + (["data.cache_dir=" + args.cache_dir] if args.cache_dir else [])


def read_run(run_dir: Path, freeze: int | None) -> dict:
    """Bytes per step (overall, and before / after `freeze`), bytes per op, tokens/s and final val loss."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "comm/bytes_per_step" in r]
    tokens = [r["perf/tokens_per_s"] for r in records if "perf/tokens_per_s" in r and "train/tokens" not in r]
    val = [r["val/loss"] for r in records if "val/loss" in r]
    comms = json.loads((run_dir / "comms.json").read_text())
    result = {
        "bytes_per_step": comms["bytes_per_step"],
        "bytes_by_op": bytes_by_op(comms),
        "tokens_per_s": statistics.median(tokens[1:] or tokens) if tokens else None,
        "final_val_loss": val[-1] if val else None,
    }
    if freeze is not None:
        before = [r["comm/bytes_per_step"] for r in steps if r["step"] <= freeze]
        after = [r["comm/bytes_per_step"] for r in steps if r["step"] > freeze]
        result["bytes_per_step_warmup"] = statistics.median(before) if before else None
        result["bytes_per_step_compressed"] = statistics.median(after) if after else None
    return result


def bytes_by_op(comms: dict) -> dict[str, float]:
    """Bytes per optimizer step by op family (all_gather_into_tensor counts as all_gather, ...)."""
    steps = max(1, comms.get("steps") or 1)
    totals: dict[str, float] = {}
    for row in comms["ops"]:
        family = op_family(row["op"])
        totals[family] = totals.get(family, 0.0) + row["total_bytes"] / steps
    return totals


def op_family(op: str) -> str:
    for family in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast"):
        if op.startswith(family):
            return family
    return op


def compare(results: dict[tuple[int, str], dict], args) -> list[dict]:
    """One row per (world, variant) with its ratios against its baseline and the target verdicts."""
    rows = []
    for (world, name), r in results.items():
        _, baseline, kind = VARIANTS[name]
        base = results.get((world, baseline)) if baseline else None
        row = {"world": world, "variant": name, "bytes_per_step": round(r["bytes_per_step"]),
               "tokens_per_s": round(r["tokens_per_s"]) if r["tokens_per_s"] else None,
               "final_val_loss": round(r["final_val_loss"], 4) if r["final_val_loss"] is not None else None,
               "bytes_vs_baseline": None, "target": None, "loss_vs_baseline": None, "target_met": None}
        if base is not None:
            verdicts = []
            if kind == "onebit":
                compressed, reference = r.get("bytes_per_step_compressed"), base["bytes_per_step"]
                row["bytes_per_step"] = round(compressed) if compressed is not None else None
                row["bytes_vs_baseline"] = round(compressed / reference, 4) if compressed and reference else None
                row["target"] = f"bytes after freeze <= 1/20 of {baseline}'s; val loss within 3%"
                verdicts.append(row["bytes_vs_baseline"] is not None and row["bytes_vs_baseline"] <= ONEBIT_BYTES_TARGET)
            elif name in REPLACED_OPS:
                ops = REPLACED_OPS[name]
                replaced = sum(base["bytes_by_op"].get(op, 0.0) for op in ops)
                # the quantized exchange of qgZ is an all-to-all: count it with what it replaces
                sent = sum(r["bytes_by_op"].get(op, 0.0) for op in ops)
                if name == "zero3+qgZ":
                    sent += r["bytes_by_op"].get("all_to_all", 0.0) - base["bytes_by_op"].get("all_to_all", 0.0)
                row["bytes_vs_baseline"] = round(sent / replaced, 4) if replaced else None
                row["target"] = f"{'+'.join(ops)} bytes <= 0.3x of {baseline}'s; val loss within 3%"
                verdicts.append(row["bytes_vs_baseline"] is not None and row["bytes_vs_baseline"] <= ZEROPP_BYTES_TARGET)
            else:
                row["bytes_vs_baseline"] = round(r["bytes_per_step"] / base["bytes_per_step"], 4)
                row["target"] = "val loss within 3%"
            if r["final_val_loss"] is not None and base["final_val_loss"]:
                rel = r["final_val_loss"] / base["final_val_loss"] - 1
                row["loss_vs_baseline"] = f"{rel:+.2%}"
                verdicts.append(rel <= LOSS_TARGET)
            row["target_met"] = all(verdicts) if verdicts else None
        rows.append(row)
    return rows


COLUMNS = ("world", "variant", "bytes_per_step", "bytes_vs_baseline", "tokens_per_s", "final_val_loss",
           "loss_vs_baseline", "target_met", "target")


def print_rows(rows: list[dict], console, title: str) -> Table:
    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("variant", "target") else "right")
    for row in rows:
        table.add_row(*["-" if row[c] is None else (f"{row[c]:,}" if type(row[c]) is int and c != "world"
                                                    else str(row[c])) for c in COLUMNS])
    print_uncut(console, table)
    return table


def run_variant(args, world: int, name: str, run_dir: Path) -> dict | None:
    hpz = hpz_overrides(name, world, args.hpz)
    if hpz is None:
        return None
    freeze = args.freeze if args.freeze is not None else args.steps // 4
    overrides = (base_overrides(args, world, run_dir) + VARIANTS[name][0] + freeze_overrides(name, freeze) + hpz
                 + args.extra)
    completed = subprocess.run([sys.executable, "-m", "dsrecipes", *overrides], capture_output=True, text=True,
                               timeout=args.timeout)
    if completed.returncode != 0:
        raise RuntimeError(f"{name} at world {world} failed (exit {completed.returncode}):\n{completed.stderr[-3000:]}")
    return read_run(run_dir, freeze if VARIANTS[name][2] == "onebit" else None)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--model", default="gpt_debug")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=16, help="sequences per optimizer step (all ranks)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--freeze", type=int, default=None, help="1-bit freeze step (default: 25%% of --steps)")
    parser.add_argument("--hpz", type=int, default=2, help="hpZ secondary partition size")
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--eval-batches", type=int, default=16)
    parser.add_argument("--max-bytes", type=int, default=2_000_000)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed per run")
    parser.add_argument("--extra", nargs="*", default=[], help="extra overrides for every run")
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    for world in args.world_size:
        if args.global_batch % world:
            parser.error(f"--global-batch {args.global_batch} is not divisible by --world-size {world}")
    names = list(args.variants)
    for name in list(names):  # every compared variant needs its baseline
        baseline = VARIANTS[name][1]
        if baseline and baseline not in names:
            names.insert(0, baseline)
    console = make_console()
    results: dict[tuple[int, str], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in args.world_size:
            for name in names:
                console.print(f"[bold]world {world}, {name}[/]: training {args.steps} steps ...")
                result = run_variant(args, world, name, Path(tmp) / f"w{world}_{name}")
                if result is not None:
                    results[(world, name)] = result
    rows = compare(results, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = print_rows(rows, console, f"communication: {args.model}, {args.steps} steps, global batch {args.global_batch}")
    chart = BarChart(table.title, "bytes sent per optimizer step (rank 0)", {"bytes_per_step": ""},
                     labels=("world", "variant"), better="min")
    write_rows(out, "communication", rows, table, chart)
    return rows


if __name__ == "__main__":
    main()
