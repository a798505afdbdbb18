"""What a verify leaves in its run directory and prints: the per-step table, verify.json, verify.md, the PNG of the
per-step loss difference (with matplotlib, the `charts` extra; otherwise one line says so) and, when the recipe logs
to TensorBoard or W&B, the per-step differences there (verify/loss_diff, verify/grad_norm_diff, ...)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from dsrecipes.verify.compare import Verdict


def _num(value, digits: int = 7) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.{digits}g}"


def step_table(result: Verdict) -> list[str]:
    header = ("step", "loss", "ref loss", "|diff|", "grad norm", "ref grad norm", "lr", "ref lr", "scale", "ref scale",
              "")
    rows = [header] + [(str(r.step), _num(r.loss), _num(r.reference_loss), _num(r.loss_diff, 3), _num(r.grad_norm),
                        _num(r.reference_grad_norm), _num(r.lr, 4), _num(r.reference_lr, 4), _num(r.loss_scale, 4),
                        _num(r.reference_loss_scale, 4), "ok" if r.ok else "DIFFERS")
                       for r in result.steps]
    return _aligned(rows)


def group_table(result: Verdict) -> list[str]:
    rows = [("tensor group", "tensors", "max |param diff|", "tensor", "")]
    rows += [(g.group, str(g.tensors), _num(g.max_diff, 3), g.tensor, "ok" if g.ok else "DIFFERS")
             for g in result.groups]
    return _aligned(rows)


def _aligned(rows) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def markdown(result: Verdict, summary: dict) -> str:
    def table(rows: list[list[str]]) -> list[str]:
        return ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])] + \
            ["| " + " | ".join(row) + " |" for row in rows[1:]]

    lines = [f"# dsrecipes.verify: {summary['name']}", "", f"**{result.message}**", "",
             f"- candidate: `python -m dsrecipes {' '.join(summary['candidate'])}` (world {summary['candidate_world']})",
             f"- reference: `python -m dsrecipes {' '.join(summary['reference'])}` (world {summary['reference_world']})",
             f"- tolerance: loss {result.tolerance.loss:g}, parameters {result.tolerance.params:g} "
             f"({summary['tolerance_reason']})", ""]
    if summary["adjustments"]:
        lines += ["## Adjusted for the check", ""] + [f"- {line}" for line in summary["adjustments"]] + [""]
    lines += ["## Per step", ""]
    lines += table([["step", "loss", "ref loss", "abs diff", "grad norm", "ref grad norm", "lr", "ref lr",
                     "loss scale", "ref loss scale", "ok"]] +
                   [[str(r.step), _num(r.loss), _num(r.reference_loss), _num(r.loss_diff, 3), _num(r.grad_norm),
                     _num(r.reference_grad_norm), _num(r.lr, 4), _num(r.reference_lr, 4), _num(r.loss_scale, 4),
                     _num(r.reference_loss_scale, 4), "yes" if r.ok else f"**no**: {r.why}"] for r in result.steps])
    lines += ["", "## Final parameters per tensor group", ""]
    lines += table([["group", "tensors", "max abs diff", "largest in", "ok"]] +
                   [[g.group, str(g.tensors), _num(g.max_diff, 3), f"`{g.tensor}`", "yes" if g.ok else "**no**"]
                    for g in result.groups])
    return "\n".join(lines) + "\n"


def write_reports(run_dir: Path, result: Verdict, summary: dict) -> list[str]:
    """verify.json, verify.md and loss_diff.png (when matplotlib is there) in run_dir; returns lines to print."""
    said = []
    payload = {**summary, "verdict": result.to_dict()}
    (run_dir / "verify.json").write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    (run_dir / "verify.md").write_text(markdown(result, summary))
    from dsrecipes.utils.charts import write_line_chart

    points = [(r.step, r.loss_diff) for r in result.steps]
    floor = max(min((d for _, d in points if d > 0), default=1e-12), 1e-12)
    png = write_line_chart(run_dir / "loss_diff.png",
                           {"|loss - reference loss|": [(s, max(d, floor)) for s, d in points],
                            "loss tolerance": [(s, result.tolerance.loss) for s, _ in points]},
                           "candidate vs reference", "step", "absolute loss difference", log_y=True)
    said.append(f"wrote {run_dir / 'verify.json'}, verify.md" + (", loss_diff.png" if png else
                " (no loss_diff.png: matplotlib is missing; pip install 'dsrecipes[charts]')"))
    return said


def _jsonable(value):
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return str(value)


def log_to_sinks(run_dir: Path, result: Verdict, logger: dict, name: str) -> list[str]:
    """The per-step differences to TensorBoard (<run dir>/tb) and W&B (offline unless a key is set) when the
    recipe logs there."""
    said = []
    if not (logger.get("tensorboard") or logger.get("wandb")):
        return said
    from omegaconf import OmegaConf

    from dsrecipes.training.reporting.loggers import MetricLoggers

    cfg = OmegaConf.merge(logger["config"], {"jsonl": False})
    sinks = MetricLoggers(cfg, run_dir, f"verify_{name}", {"verify": True})
    for row in result.steps:
        metrics = {"verify/loss_diff": row.loss_diff, "verify/loss": row.loss, "verify/reference_loss": row.reference_loss}
        if row.grad_norm is not None and row.reference_grad_norm is not None:
            metrics["verify/grad_norm_diff"] = abs(row.grad_norm - row.reference_grad_norm)
        sinks.log({k: v for k, v in metrics.items() if v is not None and math.isfinite(v)}, row.step)
    sinks.log_final({f"verify/param_diff/{g.group}": g.max_diff for g in result.groups if math.isfinite(g.max_diff)})
    sinks.close()
    said.append("logged verify/* to " + " and ".join(k for k in ("tensorboard", "wandb") if logger.get(k)))
    return said
