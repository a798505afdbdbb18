"""`optimized_metric`: the run-summary metric a Hydra job returns, so sweepers that optimise (Optuna, Nevergrad,
Ax) can drive dsrecipes. Lightning-Hydra-Template's convention:

    python -m dsrecipes -m hydra/sweeper=optuna optimized_metric=val/loss 'optimizer.lr=interval(1e-4,1e-2)' \\
        hydra.sweeper.n_trials=20 hydra.sweeper.direction=minimize

With optimized_metric unset the job returns its summary dict as before. The value is read from the summary the
job's training returns or, where that does not come back (a non-zero rank under torchrun), from
<run dir>/summary.json. A name the Trainer's summary never holds is refused before training starts; one from an
extension's namespace (e.g. data/...) is checked when the run ends, against the names the summary holds.
A sweeper that optimises the job's return value (OPTIMIZING_SWEEPERS) without optimized_metric is refused before
its first job: each job would return the summary dict, which the sweeper cannot cast to a number.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

SUMMARY_FILE = "summary.json"  # the Trainer's (dsrecipes.training.trainer.SUMMARY_FILE)

# Every name dsrecipes.training.trainer.Trainer._summary can put in summary["metrics"] (some only on some
# runs: perf/mfu with a known peak FLOP/s, the dense_* pair under random-LTD token dropping).
SUMMARY_METRICS = (
    "val/loss", "val/ppl", "train/loss", "train/first_loss", "train/steps", "train/tokens", "train/dense_tokens",
    "perf/tokens_per_s", "perf/dense_tokens_per_s", "perf/mfu", "perf/train_s", "perf/eval_s", "perf/checkpoint_s",
    "perf/startup_s", "time/total_s",
)
# Namespaces the Trainer owns: a name in one of them must be one of SUMMARY_METRICS (a typo is caught up front).
TRAINER_NAMESPACES = ("val", "train", "perf", "time")
# Sweepers that optimise the value each job returns and so need a number (hydra.sweeper._target_ -> its
# hydra/sweeper option). The basic sweeper and hydra/sweeper=autotune (which reads metrics.jsonl) take anything.
OPTIMIZING_SWEEPERS = {
    "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper": "optuna",
    "hydra_plugins.hydra_nevergrad_sweeper.nevergrad_sweeper.NevergradSweeper": "nevergrad",
    "hydra_plugins.hydra_ax_sweeper.ax_sweeper.AxSweeper": "ax",
}


def check_optimized_metric(name: str | None, mode: str = "train") -> None:
    """ValueError before any work when `name` cannot be in a run's summary (a typo such as val/los, or a mode
    that trains nothing). The Preflight callback runs it before Hydra creates the job's directory."""
    if name is None:
        return
    if mode != "train":
        raise ValueError(f"optimized_metric={name!r} needs mode=train (mode={mode} has no run summary "
                         "metrics); drop optimized_metric")
    if not name or name.split("/", 1)[0] in TRAINER_NAMESPACES and name not in SUMMARY_METRICS:
        raise ValueError(f"optimized_metric={name!r} is not a metric of the run summary; choose one of: "
                         f"{', '.join(SUMMARY_METRICS)} (or an extension's summary metric, e.g. data/tokens_saved)")


def check_sweeper_metric(sweeper_target: str | None, name: str | None, mode: str = "train") -> None:
    """ValueError before a sweep's first job when its sweeper optimises the number each job returns and
    optimized_metric does not name one (the job would train, return its summary dict, and the sweeper fail on it)."""
    sweeper = OPTIMIZING_SWEEPERS.get(str(sweeper_target))
    if sweeper is None:
        return
    if name is None:
        where = "" if mode == "train" else f" with mode=train (mode={mode} has no run summary metrics)"
        raise ValueError(f"optimized_metric=null, but hydra/sweeper={sweeper} optimises the number each job returns: "
                         f"set optimized_metric{where} to the run-summary metric to optimise; choose one of: "
                         f"{', '.join(SUMMARY_METRICS)} (or an extension's summary metric, e.g. data/tokens_saved)")
    check_optimized_metric(name, mode)


def read_summary(run_dir: str | Path) -> dict | None:
    """<run dir>/summary.json (written by rank 0 when training ends), or None when there is none."""
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def optimized_value(name: str, summary: dict | None, run_dir: str | Path) -> float:
    """summary["metrics"][name] as a float; the summary is read from run_dir when the job's return value lacks it.

    ValueError naming the metrics the summary has when `name` is not one of them or its value is not a number.
    """
    if not isinstance(summary, dict) or "metrics" not in summary:
        summary = read_summary(run_dir)
    if summary is None:
        raise ValueError(f"optimized_metric={name!r}: the run wrote no {SUMMARY_FILE} in {run_dir}, so there is no "
                         "value to return")
    metrics = summary.get("metrics", {})
    if name not in metrics:
        raise ValueError(f"optimized_metric={name!r} is not in this run's summary; its metrics are: "
                         f"{', '.join(sorted(metrics))}")
    value = metrics[name]
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"optimized_metric={name!r} has no numeric value in this run's summary ({value!r})") from None
    if not math.isfinite(number):
        # Optuna records a non-finite value as a failed trial; say so rather than return it silently
        import warnings

        warnings.warn(f"optimized_metric={name!r} is {number} for this run", stacklevel=2)
    return number
