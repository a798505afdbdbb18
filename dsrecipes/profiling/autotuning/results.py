"""What a trial measured, and the autotuner's results: table (rich + Markdown), CSV, PNG chart, best experiment.

A trial's job directory holds metrics.jsonl (the Trainer's log windows; trials log every start_profile_step
steps and train end_profile_step steps). measured_window combines the windows after the warm-up:
tokens/s = their tokens / their training seconds, latency = their seconds / their steps, FLOP/s = tokens/s x
the model's training FLOPs per token (6N + 12·L·d·T, dsrecipes.models.GPT.flops_per_token).

Written to the sweep directory:
    autotune_results.csv / .md / .png     every candidate: measured, failed, rejected (and why), not run; a row
                                           whose job was composed shows what it trains: ranks, micro-batch per
                                           rank (the candidate's), accumulation steps, global batch
    conf/experiment/<best_experiment>.yaml  the best candidate on top of the user's experiment and overrides,
                                           run with: python -m dsrecipes --config-dir <sweep dir>/conf +experiment=<name>
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from dsrecipes.profiling.autotuning.config import HIGHER_IS_BETTER, METRIC_UNITS
from dsrecipes.profiling.autotuning.pruning import GIB
from dsrecipes.profiling.autotuning.space import Candidate

RESULTS_STEM = "autotune_results"
CONFIG_DIR = "conf"


@dataclass
class TrialRecord:
    """One row of the results: a candidate and what became of it."""

    candidate: Candidate
    status: str  # ok | failed | rejected | invalid | not run
    world_size: int | None = None  # ranks the trial starts (for a rejected row: those the estimate assumed)
    estimate_bytes: float | None = None
    cap_bytes: float | None = None
    job: str = ""  # job number in the sweep directory
    value: float | None = None  # the metric
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    flops_per_s: float | None = None
    peak_gib: float | None = None  # measured (CUDA's max allocated), when the trial ran on CUDA
    note: str = ""
    accumulation: int | None = None  # the trial's gradient accumulation steps (None: its job was not composed)
    train_batch_size: int | None = None  # its global batch: micro-batch x accumulation x data-parallel ranks


def measured_window(records: list[dict], start_step: int, end_step: int) -> dict:
    """tokens/s, s/step and peak memory of the logged windows after `start_step` up to `end_step`."""
    windows = sorted((r for r in records if "perf/step_time_s" in r and "step" in r), key=lambda r: r["step"])
    previous, seconds, tokens, steps, peak = 0, 0.0, 0.0, 0, None
    for record in windows:
        count, previous = record["step"] - previous, record["step"]
        if record["step"] <= start_step or record["step"] > end_step:
            continue
        window_s = float(record["perf/step_time_s"]) * count
        seconds += window_s
        tokens += float(record["perf/tokens_per_s"]) * window_s
        steps += count
        if "mem/peak_gib" in record:
            peak = max(peak or 0.0, float(record["mem/peak_gib"]))
    if not steps or seconds <= 0:
        raise ValueError(f"no training window logged between steps {start_step} and {end_step}")
    return {"tokens_per_s": tokens / seconds, "step_time_s": seconds / steps, "steps": steps, "peak_gib": peak}


def read_trial(job_dir: Path, start_step: int, end_step: int, flops_per_token: float) -> dict:
    """A finished trial's measurements from <job dir>/metrics.jsonl (ValueError when it has none)."""
    path = Path(job_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{path} was not written")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    window = measured_window(records, start_step, end_step)
    window["flops_per_s"] = window["tokens_per_s"] * flops_per_token
    return window


def metric_value(measured: dict, metric: str) -> float:
    return {"throughput": measured["tokens_per_s"], "latency": measured["step_time_s"],
            "flops": measured["flops_per_s"]}[str(metric)]


def _num(value: float | None, fmt: str = ".4g") -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, fmt)


def _int(value: int | None) -> str:
    return "-" if value is None else str(value)


def _gib(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / GIB:.4g}"


def results_table(rows: list[TrialRecord], metric: str, best: Candidate | None, title: str):
    from rich.table import Table

    direction = "higher" if HIGHER_IS_BETTER[str(metric)] else "lower"
    table = Table(title=f"{title}: {metric} ({METRIC_UNITS[str(metric)]}, {direction} is better)")
    for name, justify in (("job", "right"), ("candidate", "left"), ("ranks", "right"), ("accum", "right"),
                          ("global batch", "right"), ("est. GiB", "right"), ("cap GiB", "right"), (str(metric), "right"),
                          ("tokens/s", "right"), ("s/step", "right"), ("TFLOP/s", "right"), ("peak GiB", "right"),
                          ("status", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    for row in rows:
        mark = "[bold green]" if best is not None and row.candidate == best else ""
        status = f"{row.status}: {row.note}" if row.note else row.status
        table.add_row(row.job or "-", f"{mark}{row.candidate.label}{' (best)' if mark else ''}",
                      _num(row.world_size, "d") if row.world_size else "-", _int(row.accumulation),
                      _int(row.train_batch_size), _gib(row.estimate_bytes), _gib(row.cap_bytes),
                      _num(row.value), _num(row.tokens_per_s, ".5g"), _num(row.step_time_s),
                      _num(row.flops_per_s / 1e12 if row.flops_per_s is not None else None, ".3g"),
                      _num(row.peak_gib), status)
    return table


def csv_rows(rows: list[TrialRecord], metric: str) -> list[dict]:
    return [{
        "job": row.job, "candidate": row.candidate.label, "zero_stage": row.candidate.zero_stage,
        "micro_batch": row.candidate.micro_batch, "activation_checkpointing": row.candidate.activation_checkpointing or "recipe",
        "offload": row.candidate.offload, "ranks": row.world_size, "gradient_accumulation_steps": row.accumulation,
        "train_batch_size": row.train_batch_size,
        "estimate_gib": None if row.estimate_bytes is None else round(row.estimate_bytes / GIB, 6),
        "cap_gib": None if row.cap_bytes is None else round(row.cap_bytes / GIB, 6),
        "metric": str(metric), "value": row.value, "tokens_per_s": row.tokens_per_s, "step_time_s": row.step_time_s,
        "flops_per_s": row.flops_per_s, "peak_gib": row.peak_gib, "status": row.status, "note": row.note,
    } for row in rows]


def write_results(sweep_dir: Path, rows: list[TrialRecord], metric: str, best: Candidate | None,
                  title: str = "autotuning") -> dict[str, Path | None]:
    """Print the table; write it as Markdown and CSV, and the chart of the measured trials, to the sweep directory."""
    from dsrecipes.utils.charts import write_bar_chart
    from dsrecipes.utils.console import make_console, print_table
    from dsrecipes.utils.tables import write_csv, write_table

    sweep_dir = Path(sweep_dir)
    table = results_table(rows, metric, best, f"{title}: {sweep_dir}")
    print_table(make_console(), table)
    out: dict[str, Path | None] = {"md": write_table(table, sweep_dir / f"{RESULTS_STEM}.md")}
    write_csv(sweep_dir / f"{RESULTS_STEM}.csv", csv_rows(rows, metric))
    out["csv"] = sweep_dir / f"{RESULTS_STEM}.csv"
    measured = [r for r in rows if r.status in ("ok", "failed")]
    highlight = next((i for i, r in enumerate(measured) if best is not None and r.candidate == best), None)
    out["png"] = write_bar_chart(sweep_dir / f"{RESULTS_STEM}.png", [r.candidate.label for r in measured],
                                 [r.value for r in measured], f"autotuning: {metric} per trial (failed: empty)",
                                 f"{metric} ({METRIC_UNITS[str(metric)]})", highlight=highlight)
    return out


def _nested(dotted: dict[str, object]) -> dict:
    """{"trainer.max_steps": 5} -> {"trainer": {"max_steps": 5}} (later keys win)."""
    tree: dict = {}
    for key, value in dotted.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = value
    return tree


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def best_experiment_yaml(
    name: str,
    sweep_dir: Path,
    candidate: Candidate,
    summary: str,
    experiments: list[str],
    group_choices: list[tuple[str, str, bool]],
    values: dict[str, object],
    run_name: str,
) -> str:
    """The best candidate as an experiment: the user's experiment(s) and group choices in the defaults list, their
    value overrides and the candidate's settings in the body. group_choices: (group, option, added with '+')."""
    command = run_command(sweep_dir, name)
    defaults: list = list(experiments)
    for group, option, added in group_choices:
        defaults.append({f"/{group}": option} if added else {f"override /{group}": option})
    if candidate.activation_checkpointing:
        defaults.append({"override /activation_checkpointing": candidate.activation_checkpointing})
    defaults.append("_self_")
    body = _merge(_merge({"name": run_name}, _nested(values)), candidate.settings())
    text = yaml.safe_dump({"defaults": defaults, **body}, sort_keys=False, default_flow_style=False)
    header = ["# @package _global_", f"# {command}", f"# {summary}",
              "# Written by the autotuner (hydra/sweeper=autotune); Hydra reads `@package` from the first line only,",
              "# so the command that runs this experiment is the line after it."]
    return "\n".join(header) + "\n" + text


def run_command(sweep_dir: Path, name: str) -> str:
    return f"python -m dsrecipes --config-dir {shlex.quote(str(Path(sweep_dir).resolve() / CONFIG_DIR))} +experiment={name}"


def write_best_experiment(sweep_dir: Path, name: str, text: str) -> Path:
    path = Path(sweep_dir) / CONFIG_DIR / "experiment" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
