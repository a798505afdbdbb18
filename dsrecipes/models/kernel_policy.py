"""kernels.backend=auto, decided per op by measurement: which injectable ops run their Triton kernel on CUDA.

    from dsrecipes.models.kernel_policy import choose_ops, load_policy
    choose_ops("auto", "cuda")["cross_entropy"]   # OpChoice(op='cross_entropy', backend='triton',
                                                   #          reason='7.9x torch on NVIDIA H200 (fwd+bwd, 2026-11-30)')

The policy is a small data file shipped in the package, kernel_policy.json beside this module: for every op
kernel injection can swap (INJECTABLE_OPS, named like dsrecipes.benchmarks.kernels' cases) the backend
"triton" or "torch" and the measurement it came from (ratio = torch ms / Triton ms, pass, shape, hardware,
date, source). An op never measured is "torch". The seed came from the ad-hoc H200 timings in docs/benchmarks.md;
`python -m dsrecipes.benchmarks.gpu_suite --out bench/` derives a fresh one from its kernel table
(policy_from_kernel_rows: triton where the Triton op is at least as fast as torch eager and torch.compile)
and `--write-policy` installs it here.

The decision (choose_ops) is a pure function of the backend, the model's device type and the policy, so it
is tested without a GPU: "triton" injects every op, "torch" none, "auto" on CUDA (with triton importable)
the ops the policy marks triton, and "auto" anywhere else none. No dsrecipes.kernels import here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

# What dsrecipes.models.kernel_injection can swap, by the kernel benchmark's op names.
INJECTABLE_OPS: dict[str, str] = {
    "layer_norm": "nn.LayerNorm -> FusedLayerNorm",
    "rms_norm": "RMSNorm -> FusedRMSNorm",
    "bias_gelu": "GeluMLP gelu_tanh(fc_in(x)) -> bias_gelu",
    "swiglu": "SwiGLUMLP silu(gate) * up -> swiglu",
    "rope": "RoPE apply_rope -> rope",
    "flash_attention": "CausalSelfAttention SDPA -> flash_attention",
    "cross_entropy": "GPT loss F.cross_entropy -> cross_entropy",
}
POLICY_BACKENDS = ("triton", "torch")
POLICY_FILE = Path(__file__).with_name("kernel_policy.json")
SCHEMA = 1


@dataclass(frozen=True)
class OpPolicy:
    """One op's entry: the backend auto uses on CUDA and the measurement behind it (None: never measured)."""

    backend: str
    ratio: float | None = None  # torch ms / Triton ms (the faster torch baseline where several were timed)
    pass_: str | None = None
    shape: str | None = None
    baseline: str | None = None
    hardware: str | None = None
    date: str | None = None
    source: str = "never measured"

    def reason(self) -> str:
        if self.ratio is None:
            return self.source
        where = f" on {self.hardware}" if self.hardware else ""
        detail = ", ".join(x for x in (self.pass_, self.date) if x)
        return f"{self.ratio:.2f}x torch{where}" + (f" ({detail})" if detail else "")

    def to_json(self) -> dict:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        return d


@dataclass(frozen=True)
class OpChoice:
    op: str
    backend: str  # "triton" | "torch"
    reason: str


def _entry(op: str, raw: Mapping, where: str) -> OpPolicy:
    if not isinstance(raw, Mapping) or raw.get("backend") not in POLICY_BACKENDS:
        value = raw.get("backend") if isinstance(raw, Mapping) else raw
        raise ValueError(f"{where}: ops.{op}.backend={value!r} is not valid; choose one of: {', '.join(POLICY_BACKENDS)}")
    known = {"backend", "ratio", "pass", "shape", "baseline", "hardware", "date", "source"}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{where}: ops.{op} has unknown keys {sorted(unknown)}; valid: {', '.join(sorted(known))}")
    fields = {k: v for k, v in raw.items() if k != "pass"}
    return OpPolicy(pass_=raw.get("pass"), **fields)


def load_policy(path: str | Path | None = None) -> dict[str, OpPolicy]:
    """{op: OpPolicy} for every injectable op, from `path` (default: the packaged kernel_policy.json).
    ValueError naming the file and the key when an op is missing, unknown or has a bad backend."""
    path = Path(path) if path is not None else POLICY_FILE
    data = json.loads(path.read_text())
    ops = data.get("ops")
    if not isinstance(ops, Mapping):
        raise ValueError(f"{path}: no 'ops' mapping (expected {{op: {{backend, ratio, ...}}}})")
    missing = [op for op in INJECTABLE_OPS if op not in ops]
    unknown = [op for op in ops if op not in INJECTABLE_OPS]
    if missing or unknown:
        raise ValueError(f"{path}: ops must be exactly the injectable ops {', '.join(INJECTABLE_OPS)}; "
                         f"missing {missing}, unknown {unknown}")
    return {op: _entry(op, ops[op], str(path)) for op in INJECTABLE_OPS}


def choose_ops(backend: str, device_type: str | None, policy: Mapping[str, OpPolicy] | None = None,
               triton_ok: bool | None = None) -> dict[str, OpChoice]:
    """{op: OpChoice} for every injectable op. backend: "triton" (all), "torch" (none) or "auto" (on a CUDA
    device with triton importable: the policy's choice per op; elsewhere none). device_type: the model's
    device type ("cuda", "cpu", ...). policy: default load_policy(). triton_ok: default triton_available()."""
    if backend in ("triton", "torch"):
        return {op: OpChoice(op, backend, f"kernels.backend={backend}") for op in INJECTABLE_OPS}
    if backend != "auto":
        raise ValueError(f"kernels.backend={backend!r} is not valid; choose one of: auto, torch, triton")
    if device_type != "cuda":
        return {op: OpChoice(op, "torch", f"the model is on {device_type}, not CUDA") for op in INJECTABLE_OPS}
    if triton_ok is None:
        from dsrecipes.kernels._utils import triton_available  # defines no kernels: safe to import early

        triton_ok = triton_available()
    if not triton_ok:
        return {op: OpChoice(op, "torch", "triton is not installed") for op in INJECTABLE_OPS}
    policy = load_policy() if policy is None else policy
    return {op: OpChoice(op, policy[op].backend, policy[op].reason()) for op in INJECTABLE_OPS}


def describe_choices(backend: str, choices: Mapping[str, OpChoice]) -> list[str]:
    """Log lines for an auto decision: one per op ("auto: cross_entropy -> triton (7.9x torch on H200 ...)"),
    or one line when every op went the same way for the same reason. Nothing for explicit backends."""
    if backend != "auto":
        return []
    reasons = {c.reason for c in choices.values()}
    if len(reasons) == 1 and len({c.backend for c in choices.values()}) == 1:
        c = next(iter(choices.values()))
        return [f"auto: every op -> {c.backend} ({c.reason})"]
    return [f"auto: {c.op} -> {c.backend} ({c.reason})" for c in choices.values()]


# --------------------------------------------------------------------------------------------------
# Deriving a policy from dsrecipes.benchmarks.kernels rows (gpu_suite writes it)
# --------------------------------------------------------------------------------------------------


def _ms(row: Mapping, impl: str) -> float | None:
    value = row.get(f"{impl}_ms")
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def policy_from_kernel_rows(rows: Iterable[Mapping], hardware: str, date: str, source: str) -> dict[str, OpPolicy]:
    """A policy from kernel benchmark rows: per injectable op, its fwd+bwd rows (fwd where it has no gradient)
    decide; "triton" when on every such row the Triton op took no longer than torch eager and than
    torch.compile (whichever of the two were measured), else "torch" (also when the Triton op failed or was
    not timed, e.g. the CPU smoke, or the op is absent: never measured). ratio = the smallest
    min(eager, compile) / triton over those rows."""
    by_op: dict[str, list[Mapping]] = {}
    for row in rows:
        by_op.setdefault(str(row.get("op")), []).append(row)
    policy = {}
    for op in INJECTABLE_OPS:
        op_rows = by_op.get(op, [])
        passes = {str(r.get("pass")) for r in op_rows}
        chosen_pass = "fwd+bwd" if "fwd+bwd" in passes else ("fwd" if "fwd" in passes else None)
        chosen = [r for r in op_rows if str(r.get("pass")) == chosen_pass]
        if not chosen:
            policy[op] = OpPolicy("torch", source="never measured (not in the kernel table)")
            continue
        ratios, baselines = [], set()
        for r in chosen:
            triton = _ms(r, "triton")
            torch_ms = {impl: ms for impl in ("eager", "compile") if (ms := _ms(r, impl)) is not None}
            if triton is None or triton <= 0 or not torch_ms:
                ratios = []
                break
            baselines.update(torch_ms)
            ratios.append(min(torch_ms.values()) / triton)
        shape = "; ".join(str(r.get("shape")) for r in chosen)
        if not ratios:
            policy[op] = OpPolicy("torch", pass_=chosen_pass, shape=shape, hardware=hardware, date=date,
                                  source=f"{source}: the Triton op or every torch baseline failed or was not timed")
            continue
        ratio = min(ratios)
        policy[op] = OpPolicy("triton" if ratio >= 1.0 else "torch", ratio=round(ratio, 3), pass_=chosen_pass,
                              shape=shape, baseline=" and ".join(sorted(baselines)), hardware=hardware, date=date,
                              source=source)
    return policy


def policy_json(policy: Mapping[str, OpPolicy], description: str) -> str:
    """The kernel_policy.json text for `policy` (what load_policy reads back)."""
    return json.dumps({"schema": SCHEMA, "description": description,
                       "ops": {op: policy[op].to_json() for op in INJECTABLE_OPS}}, indent=2) + "\n"
