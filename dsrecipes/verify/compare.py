"""The comparison of two runs: per-step series and final parameters, held to a Tolerance (pure functions, no torch
needed for the series; the suite's layout table and `python -m dsrecipes.verify` share them).

Per step: loss (held to tolerance.loss), lr (must agree to 1e-9 relative: both runs share one schedule), grad norm
and loss scale (reported, not judged: a pre-clipping norm differs as the loss does, and the loss scale's effect
shows in the loss). Final parameters: the largest |difference| per tensor group (embeddings, attention, mlp,
experts, norms, lm_head, other), held to tolerance.params; a tensor one run has and the other lacks, or of another
shape, differs by infinity.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dsrecipes.verify.config import Tolerance

SERIES = {"loss": "train/loss", "grad_norm": "train/grad_norm", "lr": "train/lr", "loss_scale": "train/loss_scale"}
GROUPS = ("embeddings", "attention", "mlp", "experts", "norms", "lm_head", "other")
LR_RTOL = 1e-9


def read_series(metrics_file: Path) -> dict[int, dict[str, float]]:
    """{step: {"loss": ..., "grad_norm": ..., "lr": ..., "loss_scale": ...}} from a run's metrics.jsonl."""
    steps: dict[int, dict[str, float]] = {}
    for line in Path(metrics_file).read_text().splitlines():
        record = json.loads(line)
        if "train/loss" in record:
            steps[int(record["step"])] = {name: record.get(key) for name, key in SERIES.items()}
    return steps


def group_of(name: str) -> str:
    """The tensor group of a parameter name of the exported model."""
    parts = name.split(".")
    if "experts" in parts or "gate" in parts or "router" in parts or "coefficient" in parts:
        return "experts"
    if any(p in ("tok_emb", "pos_emb", "wte", "wpe", "embed_tokens") for p in parts):
        return "embeddings"
    if any(p in ("lm_head", "head") for p in parts):
        return "lm_head"
    if any("norm" in p or p.startswith("ln") for p in parts):
        return "norms"
    if any(p in ("attn", "self_attn", "attention") for p in parts):
        return "attention"
    if any(p in ("mlp", "ffn") for p in parts):
        return "mlp"
    return "other"


@dataclass
class StepRow:
    step: int
    loss: float | None
    reference_loss: float | None
    loss_diff: float
    grad_norm: float | None
    reference_grad_norm: float | None
    lr: float | None
    reference_lr: float | None
    loss_scale: float | None
    reference_loss_scale: float | None
    ok: bool
    why: str = ""


@dataclass
class GroupDiff:
    group: str
    max_diff: float
    tensor: str
    tensors: int
    ok: bool


@dataclass
class Verdict:
    equivalent: bool
    tolerance: Tolerance
    steps: list[StepRow]
    groups: list[GroupDiff]
    first_step: int | None = None  # the first step whose loss (or lr) differs
    first_group: str | None = None  # the group whose parameters differ most beyond tolerance
    message: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _diff(a, b) -> float:
    if a is None or b is None:
        return math.inf
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
    return abs(a - b)


def compare_steps(candidate: dict[int, dict], reference: dict[int, dict], tolerance: Tolerance) -> list[StepRow]:
    rows = []
    for step in sorted(set(candidate) | set(reference)):
        c, r = candidate.get(step, {}), reference.get(step, {})
        loss_diff = _diff(c.get("loss"), r.get("loss"))
        why = []
        if step not in candidate or step not in reference:
            why.append("missing in the " + ("candidate" if step not in candidate else "reference"))
        elif not loss_diff <= tolerance.loss:
            why.append(f"|loss diff| {loss_diff:.3g} > {tolerance.loss:g}")
        lr_c, lr_r = c.get("lr"), r.get("lr")
        if lr_c is not None and lr_r is not None and abs(lr_c - lr_r) > LR_RTOL * max(abs(lr_c), abs(lr_r), 1e-30):
            why.append(f"lr {lr_c:.6g} != {lr_r:.6g}")
        rows.append(StepRow(step, c.get("loss"), r.get("loss"), loss_diff, c.get("grad_norm"), r.get("grad_norm"),
                            lr_c, lr_r, c.get("loss_scale"), r.get("loss_scale"), not why, "; ".join(why)))
    return rows


def compare_params(candidate: dict, reference: dict, tolerance: Tolerance) -> list[GroupDiff]:
    """Largest |difference| per tensor group between two state dicts of the same model (tensors, any dtype)."""
    worst: dict[str, tuple[float, str, int]] = {}
    for name in sorted(set(candidate) | set(reference)):
        group = group_of(name)
        a, b = candidate.get(name), reference.get(name)
        if a is None or b is None or tuple(a.shape) != tuple(b.shape):
            diff = math.inf
        else:
            diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
            diff = math.inf if math.isnan(diff) else diff
        best, tensor, count = worst.get(group, (-1.0, "", 0))
        worst[group] = (diff, name, count + 1) if diff > best else (best, tensor, count + 1)
    return [GroupDiff(g, worst[g][0], worst[g][1], worst[g][2], worst[g][0] <= tolerance.params)
            for g in GROUPS if g in worst]


def verdict(steps: list[StepRow], groups: list[GroupDiff], tolerance: Tolerance, expected_steps: int) -> Verdict:
    """Equivalent when every expected step is there with its loss within tolerance and the same lr, and every tensor
    group's parameters are within tolerance; else the message names the first step and the group that differ."""
    notes = []
    if len(steps) != expected_steps:
        notes.append(f"{len(steps)} step(s) compared, {expected_steps} expected")
    bad_steps = [row for row in steps if not row.ok]
    bad_groups = sorted((g for g in groups if not g.ok), key=lambda g: -g.max_diff)
    first_step = bad_steps[0].step if bad_steps else None
    first_group = bad_groups[0].group if bad_groups else None
    equivalent = not bad_steps and not bad_groups and not notes and bool(groups)
    if not groups:
        notes.append("no parameters to compare (no export)")
    if equivalent:
        worst_loss = max((row.loss_diff for row in steps), default=0.0)
        worst = max(groups, key=lambda g: g.max_diff)
        message = (f"EQUIVALENT: {len(steps)} steps, max |loss diff| {worst_loss:.3g} <= {tolerance.loss:g}; "
                   f"max |param diff| {worst.max_diff:.3g} ({worst.group}) <= {tolerance.params:g}")
    else:
        parts = []
        if bad_steps:
            parts.append(f"first differing step {first_step} ({bad_steps[0].why})")
        else:
            parts.append("every step's loss within tolerance")
        if bad_groups:
            g = bad_groups[0]
            parts.append(f"tensor group '{g.group}' differs most: max |param diff| {g.max_diff:.3g} > "
                         f"{tolerance.params:g} ({g.tensor})")
            if len(bad_groups) > 1:
                parts.append("also over tolerance: " + ", ".join(x.group for x in bad_groups[1:]))
        else:
            parts.append("parameters within tolerance" if groups else "")
        parts += notes
        message = "NOT EQUIVALENT: " + "; ".join(p for p in parts if p)
    return Verdict(equivalent, tolerance, steps, groups, first_step, first_group, message, notes)


def judge(candidate_series: dict[int, dict], reference_series: dict[int, dict], candidate_params: dict,
          reference_params: dict, tolerance: Tolerance, expected_steps: int) -> Verdict:
    """The whole comparison of two runs (per-step series from read_series, final state dicts): what
    `python -m dsrecipes.verify` decides, and what the suite's layout table asks of every row."""
    steps = compare_steps(candidate_series, reference_series, tolerance)
    return verdict(steps, compare_params(candidate_params, reference_params, tolerance), tolerance, expected_steps)
