"""The verify.* keys and the tolerances a verdict is held to.

The tolerances are the layout-equivalence table's (tests/integration/equivalence/table.py imports them from here,
so the suite and the command hold layouts to one set of numbers). Absolute, over the compared steps:

* FP32 (both runs fp32): losses 2e-5, parameters 5e-5. Layouts differ from one process only in fp32 summation order
  (split batches averaged across ranks, reduce-scatters, matmuls split over tp, micro-batches of a pipeline
  schedule), about 1e-7 relative per step; Adam lets it grow slowly; any real error (a wrong loss scaling, a missing
  gradient shard) moves the loss by more than 1e-2.
* SIXTEEN_BIT (bf16 / fp16, with or without fp32 master weights, both runs at that precision): losses 2e-2,
  parameters 5e-3. 16-bit activations and gradients round differently when the batch is split (measured in the
  table: losses 3e-3 - 4e-3, parameters 1e-3 - 2e-3).
* BF16_EXPERTS: losses 1e-2, parameters 5e-3 (bf16 expert gradients rounded from half-batch sums; the table's rows).
* COMPILED (compile=blocks / full against eager, fp32): losses 1e-4, parameters 2e-4: inductor's fused loops sum in
  another order than ATen's kernels.

A candidate at another precision than its reference (precision=bf16 against the default fp32 reference) is held to
the reference's tolerance: the question is whether the run equals the fp32 one, and 16-bit rounding is a difference.
verify.reference_precision=same trains the reference at the candidate's precision and applies SIXTEEN_BIT.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Tolerance:
    loss: float
    params: float


FP32 = Tolerance(loss=2e-5, params=5e-5)
SIXTEEN_BIT = Tolerance(loss=2e-2, params=5e-3)
MASTER_WEIGHTS = SIXTEEN_BIT  # the table's name for the 16-bit rows (master weights in fp32)
BF16_EXPERTS = Tolerance(loss=1e-2, params=5e-3)
COMPILED = Tolerance(loss=1e-4, params=2e-4)

REFERENCE_PRECISIONS = ("fp32", "same")
LAUNCHERS = ("self", "torchrun")


@dataclass
class VerifyConfig:
    """The verify.* keys (everything else on the command line is the recipe's)."""

    steps: int = 10  # optimizer steps both runs train and the table compares
    # single: the recipe in one process (layout keys reset, the same global batch); else overrides, space-separated,
    # applied on top of the recipe for the reference, e.g. "launcher.nproc_per_node=2 zero.stage=0"
    reference: str = "single"
    reference_precision: str = "fp32"  # fp32 | same (the reference at the recipe's precision, 16-bit tolerance)
    shrink: bool = False  # a shrunk model of the same family (fewer layers, narrower) that keeps the layout valid
    launcher: str = "self"  # self: dsrecipes spawns its workers | torchrun: the candidate runs under torchrun
    loss_atol: float | None = None  # null = the precision's tolerance (dsrecipes.verify.config)
    params_atol: float | None = None  # null = the precision's tolerance
    timeout_s: int = 3600  # each run's limit
    dir: str | None = None  # the verify run directory; null = outputs/verify/<date>/<time>_<name>


def _convert(name: str, kind, text: str):
    kind = str(kind)
    if text in ("null", "None") and "None" in kind:
        return None
    try:
        if kind.startswith("bool"):
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
    except ValueError:
        raise ValueError(f"verify.{name}={text!r} is not a valid {kind.split(' ')[0]}") from None
    return text


def parse_arguments(argv: list[str]) -> tuple[VerifyConfig, list[str]]:
    """Split a command line into VerifyConfig (the verify.* keys) and the recipe's own overrides, checked."""
    known = {f.name: f.type for f in fields(VerifyConfig)}
    values, recipe = {}, []
    for arg in argv:
        if not arg.startswith("verify."):
            recipe.append(arg)
            continue
        key, sep, value = arg[len("verify."):].partition("=")
        if not sep:
            raise ValueError(f"{arg!r}: verify keys take a value, verify.KEY=VALUE")
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=3)
            hint = f" (did you mean {', '.join('verify.' + c for c in close)}?)" if close else ""
            raise ValueError(f"verify.{key} is not a verify key{hint}; valid: {', '.join(known)}")
        values[key] = _convert(key, known[key], value)
    config = VerifyConfig(**values)
    check(config)
    return config, recipe


def check(config: VerifyConfig) -> None:
    if config.steps < 1:
        raise ValueError(f"verify.steps={config.steps}: train at least 1 step")
    if config.reference_precision not in REFERENCE_PRECISIONS:
        raise ValueError(f"verify.reference_precision={config.reference_precision!r}; choose one of: "
                         f"{', '.join(REFERENCE_PRECISIONS)}")
    if config.launcher not in LAUNCHERS:
        raise ValueError(f"verify.launcher={config.launcher!r}; choose one of: {', '.join(LAUNCHERS)}")
    for key in ("loss_atol", "params_atol"):
        value = getattr(config, key)
        if value is not None and not value >= 0:
            raise ValueError(f"verify.{key}={value}: a tolerance is >= 0 (or null for the precision's)")
    if config.timeout_s < 1:
        raise ValueError(f"verify.timeout_s={config.timeout_s}: at least 1 second")
