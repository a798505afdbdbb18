"""The GPU suite's figures: one row per figure (section, name, value, unit, target, met, note), the issue's
targets applied to them, and gpu_suite.csv / gpu_suite.md (markdown tables ready for docs/benchmarks.md).

dsrecipes.benchmarks.gpu_suite runs the sections and turns each section's own rows into Figures here, so the
target logic (and its tests) do not need a GPU: every function takes plain row dicts.

Targets (issue 22): GPT-2 124M >= 50% MFU in bf16 with compile; flash attention forward >= 0.9x SDPA at
seq 4096 head dim 128; norms >= 80% of HBM bandwidth; batch-1 decode of a 1.3B model >= 70% of the
bandwidth roofline; and, from the inference benchmark's own list, int8 decode >= 1.6x bf16.
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dsrecipes.utils.tables import write_csv

FIELDS = ("section", "name", "value", "unit", "target", "met", "note")
MFU_TARGET = 0.5
FLASH_TARGET = 0.9
NORM_HBM_TARGET = 0.8
DECODE_ROOFLINE_TARGET = 0.7
INT8_DECODE_TARGET = 1.6
COMPILE_VARIANT = "precision=bf16 compile=blocks"


@dataclass
class Figure:
    section: str
    name: str
    value: float | int | None
    unit: str = ""
    target: str = ""  # e.g. ">= 0.5"; empty when the issue names none
    met: str = ""  # "yes" | "no" | "-" (no value) | "n/a (smoke)" | "" (no target)
    note: str = ""


def with_target(fig: Figure, threshold: float, smoke: bool) -> Figure:
    """`fig` with target ">= threshold" and whether its value meets it (smoke runs never claim a target)."""
    fig.target = f">= {threshold:g}"
    if smoke:
        fig.met = "n/a (smoke)"
    elif fig.value is None:
        fig.met = "-"
    else:
        fig.met = "yes" if fig.value >= threshold else "no"
    return fig


def _num(value) -> float | None:
    try:
        return None if value in (None, "") else float(value)
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------------------------------
# Section rows -> figures
# --------------------------------------------------------------------------------------------------


def kernel_figures(rows: Iterable[Mapping], hbm_gbps: float | None, smoke: bool) -> list[Figure]:
    """Per kernel row: the subject's, eager's and compile's throughput and both speed-ups; plus the targets
    (flash attention forward x SDPA, each norm pass's fraction of HBM bandwidth)."""
    figs: list[Figure] = []
    for r in rows:
        subject, unit = r["subject"], r["metric"]
        key = "tflops" if unit == "TFLOP/s" else "gbps"
        label = f"{r['op']} {r['pass']} [{r['shape']}]"
        for impl in (subject, "eager", "compile"):
            error = r.get(f"{impl}_error") or ""
            figs.append(Figure("kernels", f"{label} {impl}", _num(r.get(f"{impl}_{key}")), unit, note=error))
        for other in ("eager", "compile"):
            figs.append(Figure("kernels", f"{label} {subject} x {other}", _num(r.get(f"speedup_vs_{other}")), "x"))
        if r["op"] == "flash_attention" and r["pass"] == "fwd":
            figs.append(with_target(Figure("kernels", "target: flash_attention fwd x SDPA (T=4096, D=128)",
                                           _num(r.get("speedup_vs_eager")), "x", note=str(r["shape"])),
                                    FLASH_TARGET, smoke))
        if r["op"] in ("layer_norm", "rms_norm"):
            gbps = _num(r.get(f"{subject}_gbps"))
            frac = gbps / hbm_gbps if gbps is not None and hbm_gbps else None
            note = f"{r['shape']}; HBM {hbm_gbps:g} GB/s" if hbm_gbps else f"{r['shape']}; no --hbm-gbps for this device"
            figs.append(with_target(Figure("kernels", f"target: {r['op']} {r['pass']} fraction of HBM bandwidth",
                                           frac, "fraction", note=note), NORM_HBM_TARGET, smoke))
    return figs


def train_figures(rows: Iterable[Mapping], smoke: bool) -> list[Figure]:
    """Per variant: tokens/s, MFU, peak GiB (or a failed / skipped row with the error); the compile variant's
    MFU carries the >= 50% target."""
    figs: list[Figure] = []
    for r in rows:
        v = r["variant"]
        if r["status"] != "ok":
            figs.append(Figure("train", f"{v}: tokens/s", None, "tokens/s", met="", note=f"{r['status']}: {r['error']}"))
            if v == COMPILE_VARIANT:
                figs.append(with_target(Figure("train", f"target: {v}: MFU", None, "fraction", note=r["status"]),
                                        MFU_TARGET, smoke))
            continue
        figs.append(Figure("train", f"{v}: tokens/s", _num(r["tokens_per_s"]), "tokens/s"))
        figs.append(Figure("train", f"{v}: peak memory", _num(r["peak_mem_gib"]), "GiB"))
        mfu = Figure("train", f"{v}: MFU", _num(r["mfu"]), "fraction",
                     note="" if r["mfu"] else "no MFU: unknown device peak (trainer.peak_tflops)")
        if v == COMPILE_VARIANT:
            mfu.name = f"target: {v}: MFU"
            with_target(mfu, MFU_TARGET, smoke)
        figs.append(mfu)
    return figs


def inference_figures(rows: Iterable[Mapping], skipped: Mapping[str, str], smoke: bool) -> list[Figure]:
    """Per implementation (batch 1): decode tokens/s and the fraction of the bandwidth roofline (target on
    the bf16 rows, engine and graph); int8 decode x bf16 at the same CUDA-graph setting (target 1.6x)."""
    rows = list(rows)
    by = {(r["impl"], r["batch"]): r for r in rows}
    figs: list[Figure] = []
    for r in rows:
        name = f"{r['impl']} batch {r['batch']}"
        figs.append(Figure("inference", f"{name}: decode", _num(r["decode_tok_s"]), "tokens/s"))
        figs.append(Figure("inference", f"{name}: per-token latency", _num(r["per_token_ms"]), "ms"))
        roof = Figure("inference", f"{name}: fraction of bandwidth roofline", _num(r.get("bandwidth_frac")), "fraction",
                      note=f"{r['dtype']}, {r['weight_mib']:.0f} MiB weights")
        if r["impl"] in ("engine", "graph") and r["batch"] == 1:
            roof.name = f"target: {roof.name}"
            with_target(roof, DECODE_ROOFLINE_TARGET, smoke)
        figs.append(roof)
    for int8, bf16 in (("int8", "engine"), ("int8_graph", "graph")):
        a, b = by.get((int8, 1)), by.get((bf16, 1))
        if a and b:
            figs.append(with_target(Figure("inference", f"target: {int8} decode x {bf16} (batch 1)",
                                           a["decode_tok_s"] / b["decode_tok_s"], "x"), INT8_DECODE_TARGET, smoke))
    for impl, why in skipped.items():
        figs.append(Figure("inference", f"{impl}: decode", None, "tokens/s", note=f"skipped: {why}"))
    return figs


def timing_figures(times: Mapping[str, float], budgets: Mapping[str, float], total_budget: float,
                   smoke: bool) -> list[Figure]:
    figs = [Figure("suite", f"{s} wall time", round(t, 1), "s", target=f"<= {budgets[s]:g}",
                   met="n/a (smoke)" if smoke else ("yes" if t <= budgets[s] else "no")) for s, t in times.items()]
    total = sum(times.values())
    figs.append(Figure("suite", "total wall time", round(total, 1), "s", target=f"<= {total_budget:g}",
                       met="n/a (smoke)" if smoke else ("yes" if total <= total_budget else "no")))
    return figs


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


def hardware_line() -> str:
    """GPU name, torch / CUDA / Triton versions, the date: the line above the suite's tables."""
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        device = f"no GPU (CPU: {platform.processor() or platform.machine()})"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    return (f"{device}; torch {torch.__version__}; CUDA {torch.version.cuda or 'none'}; Triton {triton_version}; "
            f"{datetime.date.today().isoformat()}")


def _cell(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value).replace("|", "\\|")


def markdown_table(head: list[str], body: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def kernel_markdown(rows: Iterable[Mapping]) -> str:
    """The kernel table in one line per op, shape and pass (throughputs and speed-ups)."""
    rows = list(rows)
    body = []
    for r in rows:
        s, unit = r["subject"], r["metric"]
        key = "tflops" if unit == "TFLOP/s" else "gbps"
        body.append([r["op"], r["shape"], r["pass"], unit, _num(r.get(f"{s}_{key}")), _num(r.get(f"eager_{key}")),
                     _num(r.get(f"compile_{key}")), _num(r.get("speedup_vs_eager")), _num(r.get("speedup_vs_compile"))])
    subject = rows[0]["subject"] if rows else "triton"
    return markdown_table(["op", "shape", "pass", "unit", subject, "eager", "compile", "x vs eager", "x vs compile"], body)


def write_suite(out: Path, figs: list[Figure], header: list[str], extra_md: Mapping[str, str]) -> tuple[Path, Path]:
    """gpu_suite.csv (every figure) and gpu_suite.md: header lines, the targets table, then one table per
    section (extra_md[section] replaces the generic table, e.g. the kernels' compact one)."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / "gpu_suite.csv", out / "gpu_suite.md"
    write_csv(csv_path, [asdict(f) for f in figs], list(FIELDS))
    parts = ["\n".join(header) + "\n"]
    targets = [f for f in figs if f.target and f.section != "suite"]
    parts.append("### Targets\n\n" + markdown_table(["section", "figure", "value", "unit", "target", "met", "note"],
                                                   [[f.section, f.name, f.value, f.unit, f.target, f.met, f.note]
                                                    for f in targets]))
    for section in dict.fromkeys([*(f.section for f in figs), *extra_md]):
        if section in extra_md:
            parts.append(f"### {section}\n\n{extra_md[section]}")
            continue
        rows = [[f.name, f.value, f.unit, f.target, f.met, f.note] for f in figs if f.section == section]
        parts.append(f"### {section}\n\n" + markdown_table(["figure", "value", "unit", "target", "met", "note"], rows))
    md_path.write_text("\n".join(parts))
    return csv_path, md_path
