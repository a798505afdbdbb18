"""`python -m dsrecipes.verify`: is a recipe's layout equivalent to one process, step by step?

    python -m dsrecipes.verify +experiment=gpt_zero3                       # ZeRO-3 vs one fp32 process, 10 steps
    python -m dsrecipes.verify model=gpt_debug zero.stage=3 launcher.nproc_per_node=2 verify.steps=4
    python -m dsrecipes.verify +experiment=gpt_3d verify.shrink=true       # a smaller model of the same family
    python -m dsrecipes.verify +experiment=gpt_pp precision=bf16_master verify.reference_precision=same
    python -m dsrecipes.verify +experiment=gpt_tp verify.reference="parallel.tp=1 launcher.nproc_per_node=1"
    python -m dsrecipes.verify +experiment=gpt_zero3 verify.launcher=torchrun   # the candidate under torchrun

Trains the recipe (the candidate) and a reference (by default the recipe in one fp32 process, same data order,
initial weights and global batch) for verify.steps steps each, prints a per-step table (loss, grad norm, lr, loss
scale) and the largest final parameter difference per tensor group, and a verdict against the precision's
tolerance. Exit codes: 0 equivalent, 1 not equivalent (the message names the first step and the tensor group that
differ), 2 a refused recipe or verify key (the training CLI's message; nothing is trained), 3 a run failed.
Writes verify.json, verify.md and loss_diff.png into outputs/verify/<date>/<time>_<name>/ (the two runs under it).
"""

from __future__ import annotations

import sys
import time
from datetime import datetime
from pathlib import Path

from dsrecipes.verify.config import VerifyConfig

PROGRAM = "dsrecipes.verify"
EXIT_EQUIVALENT, EXIT_DIFFERENT, EXIT_USER_ERROR, EXIT_RUN_FAILED = 0, 1, 2, 3


def usage() -> str:
    from dsrecipes.cli_help import dataclass_keys

    doc = (__doc__ or "").split("\n", 2)[2]
    return ("usage: python -m dsrecipes.verify [RECIPE OVERRIDES ...] [verify.KEY=VALUE ...]\n\n" + doc +
            "\nverify keys (defaults):\n" + "\n".join(dataclass_keys(VerifyConfig, "verify.")) + "\n")


def verify_dir(config: VerifyConfig, name: str) -> Path:
    from dsrecipes.config.run_directory import claim_run_dir

    if config.dir:
        path = Path(config.dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
    now = datetime.now()
    return Path(claim_run_dir(f"outputs/verify/{now:%Y-%m-%d}", f"{now:%H-%M-%S}", name))


def main(argv: list[str] | None = None, runner=None) -> int:
    """The command; returns (and, run as a program, exits with) the exit code. runner: see dsrecipes.verify.runner."""
    from dsrecipes.cli_help import print_help_and_exit, wants_help

    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        print_help_and_exit(usage())
    return verify(argv, runner)


def _error(message: str) -> int:
    print(f"{PROGRAM}: error: {message}", file=sys.stderr, flush=True)
    return EXIT_USER_ERROR


def verify(argv: list[str], runner=None) -> int:
    from dsrecipes.launch.environment import under_launcher
    from dsrecipes.utils.errors import USER_ERRORS, user_error_message
    from dsrecipes.verify.config import parse_arguments

    if under_launcher():
        return _error("run dsrecipes.verify as one process; it starts the runs itself "
                      "(verify.launcher=torchrun runs the candidate under torchrun)")
    try:
        config, recipe = parse_arguments(argv)
        plan = _plan(recipe, config)
    except USER_ERRORS as error:
        return _error(user_error_message(error))
    except Exception as error:  # noqa: BLE001 - Hydra's composition errors (an unknown key, a missing option)
        if type(error).__module__.split(".")[0] not in ("hydra", "omegaconf"):
            raise
        from dsrecipes.config.unknown_key_hint import unknown_key_message

        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        hint = unknown_key_message(error)  # an unknown key of a schema: the closest valid keys, as the CLI says
        return _error(f"{first}\n{PROGRAM}: error: {hint}" if hint else first)
    from dsrecipes.verify.runner import run_subprocess

    runner = runner or run_subprocess
    run_dir = verify_dir(config, plan.name).resolve()
    print(f"{PROGRAM}: {run_dir}")
    print(f"  candidate (world {plan.candidate_world}, {config.launcher}): {' '.join(plan.candidate)}")
    print(f"  reference (world {plan.reference_world}): {' '.join(plan.reference)}")
    for line in plan.adjustments:
        print(f"  adjusted: {line}")
    print(f"  tolerance: loss {plan.tolerance.loss:g}, parameters {plan.tolerance.params:g} ({plan.tolerance_reason})",
          flush=True)
    seconds = {}
    for role, overrides, nproc, launcher in (("candidate", plan.candidate, plan.candidate_world, config.launcher),
                                             ("reference", plan.reference, plan.reference_world, "self")):
        start = time.perf_counter()
        log = run_dir / f"{role}.log"
        code = runner(overrides, run_dir / role, log, nproc, launcher, config.timeout_s)
        seconds[role] = round(time.perf_counter() - start, 1)
        if code != 0:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            print(f"{PROGRAM}: the {role} run failed (exit {code}); its log {log} ends:\n{tail}", file=sys.stderr)
            return EXIT_RUN_FAILED
        print(f"  {role}: trained in {seconds[role]} s", flush=True)
    return _compare_and_report(run_dir, plan, config, seconds)


def _plan(recipe, config):
    """The two runs' overrides, after the training CLI's checks of the recipe's command line: a value Hydra cannot
    parse (with how to quote it), a `+key` no schema has or a non-boolean for a boolean key, a refused layout."""
    import warnings

    from dsrecipes.config.override_values import check_override_syntax, check_override_values
    from dsrecipes.config.preflight import check_train_job
    from dsrecipes.config.store import compose
    from dsrecipes.verify.plan import build_plan

    check_override_syntax(recipe)

    def checked_compose(overrides):
        cfg = compose(overrides)
        check_override_values(overrides, cfg)
        return cfg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the runs print the recipe's warnings themselves
        return build_plan(recipe, config, checked_compose, check_train_job)


def _compare_and_report(run_dir: Path, plan, config: VerifyConfig, seconds: dict) -> int:
    from dsrecipes.models import load_exported
    from dsrecipes.verify.compare import judge, read_series
    from dsrecipes.verify.report import group_table, log_to_sinks, step_table, write_reports

    series = {role: read_series(run_dir / role / "metrics.jsonl") for role in ("candidate", "reference")}
    params = {role: load_exported(run_dir / role / "export")[0].state_dict() for role in ("candidate", "reference")}
    result = judge(series["candidate"], series["reference"], params["candidate"], params["reference"], plan.tolerance,
                   config.steps)
    print()
    print("\n".join(step_table(result)))
    print()
    print("\n".join(group_table(result)))
    print()
    summary = {"name": plan.name, "candidate": plan.candidate, "reference": plan.reference,
               "candidate_world": plan.candidate_world, "reference_world": plan.reference_world,
               "launcher": config.launcher, "steps": config.steps, "tolerance_reason": plan.tolerance_reason,
               "adjustments": plan.adjustments, "seconds": seconds, "verify": vars(config)}
    for line in write_reports(run_dir, result, summary) + log_to_sinks(run_dir, result, plan.logger, plan.name):
        print(f"  {line}")
    print(f"{PROGRAM}: {result.message}", flush=True)
    return EXIT_EQUIVALENT if result.equivalent else EXIT_DIFFERENT


if __name__ == "__main__":
    sys.exit(main())
