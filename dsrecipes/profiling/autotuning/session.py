"""One autotuning run, from the keys to the best experiment, independent of how trials are launched.

    report = autotune(cfg, facts, validate, run_trial, sweep_dir, best_inputs)

1. check the keys; build the groups (stage x checkpointing x offload);
2. ask `validate(candidate)` for each group's world size (a recipe the checks refuse is rejected as invalid);
3. prune with the memory estimator against the cap (dsrecipes.profiling.autotuning.pruning); nothing fits:
   NoCandidateFits, before any trial;
4. validate every planned candidate: `validate` returns the TrialLayout its job trains (the candidate as
   launched, ranks, micro-batch, accumulation, global batch); one whose job would train another micro-batch
   per rank than the candidate's is invalid, and the estimate is the layout's (its ranks, its micro-batch);
   then the tuner proposes, `run_trial(candidate)` trains it (the Hydra sweeper launches a job) and its
   metrics.jsonl is read; a failed trial is recorded;
5. results table / CSV / chart and the best experiment in the sweep directory: every row that was validated
   shows the layout its job trains.

The Hydra sweeper (hydra_plugins/dsrecipes_autotune) supplies validate and run_trial; tests supply fakes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dsrecipes.profiling.autotuning.config import HIGHER_IS_BETTER, METRIC_UNITS, AutotuneConfig, validate_autotune_config
from dsrecipes.profiling.autotuning.pruning import GIB, MemoryNeed, Rejection, gib, memory_need, plan_candidates
from dsrecipes.profiling.autotuning.recipe import RecipeFacts, default_cap_bytes
from dsrecipes.profiling.autotuning.results import (
    TrialRecord,
    best_experiment_yaml,
    metric_value,
    read_trial,
    run_command,
    write_best_experiment,
    write_results,
)
from dsrecipes.profiling.autotuning.space import Candidate, Group, TrialLayout, search_groups
from dsrecipes.profiling.autotuning.tuners import make_tuner, run_tuning


@dataclass
class TrialRun:
    """What launching one trial gave: its job number and directory, or the error it failed with."""

    job: str
    job_dir: Path | None
    error: str | None = None


@dataclass
class BestInputs:
    """What the best experiment is built on: the user's experiment(s), group choices and value overrides."""

    experiments: list[str] = field(default_factory=list)
    group_choices: list[tuple[str, str, bool]] = field(default_factory=list)
    values: dict[str, object] = field(default_factory=dict)
    run_name: str = "autotuned"
    command_line: str = ""


@dataclass
class AutotuneReport:
    rows: list[TrialRecord]
    best: TrialRecord | None
    stopped: str
    files: dict[str, Path | None]
    experiment: Path | None = None
    command: str | None = None


def _say(message: str) -> None:
    from dsrecipes.utils.console import make_console

    make_console(highlight=False).print(f"[bold]autotune:[/bold] {message}")


def _record(candidate: Candidate, status: str, need: MemoryNeed, layout: TrialLayout, note: str = "") -> TrialRecord:
    """A row for a validated candidate: its estimate and the layout its job trains."""
    return TrialRecord(candidate, status, layout.world_size, need.total, need.cap, note=note,
                       accumulation=layout.accumulation, train_batch_size=layout.train_batch_size)


def autotune(
    cfg: AutotuneConfig,
    facts: RecipeFacts,
    validate: Callable[[Candidate], TrialLayout],
    run_trial: Callable[[Candidate], TrialRun],
    sweep_dir: Path,
    best_inputs: BestInputs,
    say: Callable[[str], None] = _say,
) -> AutotuneReport:
    """The whole search (see the module docstring); raises ValueError before any trial when nothing can run."""
    validate_autotune_config(cfg)
    metric, higher = str(cfg.metric), HIGHER_IS_BETTER[str(cfg.metric)]
    groups = search_groups(list(cfg.zero_stages), cfg.fast, offload=facts.device == "cuda")
    if not cfg.fast and facts.device != "cuda":
        say("fast=false: CPU offload candidates are left out (the trials train on the CPU)")
    invalid: list[Rejection] = []
    worlds: dict[Group, int] = {}
    low = cfg.min_train_micro_batch_size_per_gpu
    for group in groups:
        probe = Candidate(group.zero_stage, group.activation_checkpointing, group.offload, low)
        try:
            worlds[group] = validate(probe).world_size
        except ValueError as error:
            invalid.append(Rejection(probe, None, f"invalid: {error}"))
    if not worlds:
        raise ValueError(f"no candidate is a valid recipe: {invalid[0].candidate.label}: {invalid[0].reason}")

    def cap_of(world: int) -> float:
        return cfg.max_memory_gib * GIB if cfg.max_memory_gib is not None else default_cap_bytes(facts.device, world)

    valid_groups = [g for g in groups if g in worlds]
    plan = plan_candidates(facts.memory, valid_groups, low, cfg.max_train_micro_batch_size_per_gpu,
                           cfg.num_tuning_micro_batch_sizes, worlds.__getitem__, cap_of, facts.checkpointing)
    needs: dict[Candidate, MemoryNeed] = {}
    layouts: dict[Candidate, TrialLayout] = {}
    for planned, need in plan.candidates:
        try:
            layout = validate(planned)
            if layout.micro_batch != planned.micro_batch:
                raise ValueError(f"its job would train micro-batch {layout.micro_batch} per rank, not "
                                 f"{planned.micro_batch} ({layout.describe()})")
        except ValueError as error:
            invalid.append(Rejection(planned, need, f"invalid: {error}"))
            continue
        candidate = layout.candidate  # as launched: the sweeper may have pinned its worker count
        if layout.world_size != need.world_size:  # the estimate is for the ranks the trial starts
            world = layout.world_size
            need = memory_need(facts.memory, candidate, world, cap_of(world), facts.checkpointing)
            if not need.fits:
                plan.rejected.append(Rejection(candidate, need, f"rejected: needs {gib(need.total)} GiB > cap "
                                                                f"{gib(need.cap)} GiB"))
                continue
        needs[candidate], layouts[candidate] = need, layout
    if not needs:
        first = invalid[-1]
        raise ValueError(f"no candidate that fits is a valid recipe: {first.candidate.label}: {first.reason}")
    candidates = list(needs)
    say(f"{len(candidates)} candidate(s) to measure, {len(plan.rejected)} rejected by the memory estimate, "
        f"{len(invalid)} invalid; metric {metric} over steps {cfg.start_profile_step + 1}..{cfg.end_profile_step}")

    tuner, note = make_tuner(str(cfg.tuner_type), candidates, higher, cfg.tuner_seed)
    if note:
        say(note)
    records: dict[Candidate, TrialRecord] = {}

    def measure(candidate: Candidate) -> float | None:
        need = needs[candidate]
        record = _record(candidate, "failed", need, layouts[candidate])
        records[candidate] = record
        say(f"trial {len(records)}: {candidate.label}: {layouts[candidate].describe()} "
            f"({' '.join(candidate.overrides())})")
        ran = run_trial(candidate)
        record.job = ran.job
        if ran.error is not None or ran.job_dir is None:
            record.note = ran.error or "no job directory"
            say(f"trial {len(records)} failed: {record.note}")
            return None
        try:
            measured = read_trial(ran.job_dir, cfg.start_profile_step, cfg.end_profile_step, facts.flops_per_token)
        except (OSError, ValueError) as error:
            record.note = str(error)
            return None
        record.status = "ok"
        record.value = metric_value(measured, metric)
        record.tokens_per_s, record.step_time_s = measured["tokens_per_s"], measured["step_time_s"]
        record.flops_per_s, record.peak_gib = measured["flops_per_s"], measured["peak_gib"]
        say(f"trial {len(records)}: {metric} {record.value:.4g} {METRIC_UNITS[metric]}")
        return record.value

    outcome = run_tuning(tuner, measure, cfg.tuner_num_trials, cfg.tuner_early_stopping, higher)
    rows = []
    for candidate in candidates:
        need = needs[candidate]
        rows.append(records.get(candidate) or _record(candidate, "not run", need, layouts[candidate], outcome.stopped))
    for rejection in [*plan.rejected, *invalid]:
        need = rejection.need
        status, _, note = rejection.reason.partition(": ")
        rows.append(TrialRecord(rejection.candidate, status, need.world_size if need else None,
                                need.total if need else None, need.cap if need else None, note=note))
    order = {g: i for i, g in enumerate(groups)}
    rows.sort(key=lambda r: (order.get(r.candidate.group, len(order)), r.candidate.micro_batch))
    best = records[outcome.best[0]] if outcome.best else None
    files = write_results(Path(sweep_dir), rows, metric, best.candidate if best else None)
    say(f"search ended: {outcome.stopped}; results: {files['csv']}")
    report = AutotuneReport(rows, best, outcome.stopped, files)
    if best is None:
        raise ValueError(f"every trial failed (see the job directories under {sweep_dir} and {files['csv']})")
    summary = (f"best of {len(outcome.trials)} trial(s) by {metric}: {best.candidate.label}, {best.value:.4g} "
               f"{METRIC_UNITS[metric]} (sweep {Path(sweep_dir).resolve()}, job {best.job})")
    if best_inputs.command_line:
        summary += f"; tuned: {best_inputs.command_line}"
    text = best_experiment_yaml(cfg.best_experiment, Path(sweep_dir), best.candidate, summary, best_inputs.experiments,
                                best_inputs.group_choices, best_inputs.values, best_inputs.run_name)
    report.experiment = write_best_experiment(Path(sweep_dir), cfg.best_experiment, text)
    report.command = run_command(Path(sweep_dir), cfg.best_experiment)
    say(f"{summary.split(' (sweep')[0]}")
    say(f"best experiment: {report.experiment}\n  run it: {report.command}")
    return report
