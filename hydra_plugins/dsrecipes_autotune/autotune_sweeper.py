"""The `autotune` Hydra sweeper: dsrecipes' autotuner, each trial a job launched by Hydra's configured launcher.

    python -m dsrecipes -m hydra/sweeper=autotune +experiment=gpt_tiny
    python -m dsrecipes -m hydra/sweeper=autotune +experiment=gpt_tiny model=gpt_debug \
        hydra.sweeper.zero_stages=[0,3] hydra.sweeper.max_memory_gib=4 hydra.sweeper.tuner_type=random
    python -m dsrecipes.autotune +experiment=gpt_tiny max_memory_gib=4        # the short entry

The keys are dsrecipes.profiling.autotuning.config.AutotuneConfig (DeepSpeed's autotuning keys), registered here
in Hydra's ConfigStore as hydra/sweeper/autotune. The search itself lives in dsrecipes.profiling.autotuning.session;
this file turns candidates into Hydra jobs: the user's overrides + the trial settings + the candidate's
overrides, composed and checked in-process first (a recipe the checks refuse is rejected, not launched; what
the checks leave is what the trial trains: trial_layout), then launched one at a time through self.launcher
(the basic launcher locally, submitit on SLURM), job directories <sweep dir>/<job num>. A job that fails (out of
memory, a crash, a worker exiting) is recorded as failed.
"""

# No `from __future__ import annotations` here: Hydra's plugin scan executes this module before it is in
# sys.modules, and dataclasses then cannot resolve string annotations (AttributeError in dataclasses._is_type).
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from dsrecipes.profiling.autotuning.config import AutotuneConfig


@dataclass
class AutotuneSweeperConf(AutotuneConfig):
    _target_: str = "hydra_plugins.dsrecipes_autotune.autotune_sweeper.AutotuneSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="autotune", node=AutotuneSweeperConf, provider="dsrecipes")

# Keys a candidate sets (the user's values for them are replaced) and the trial-only settings.
TUNED_KEYS = ("zero.stage", "trainer.train_micro_batch_size_per_gpu", "trainer.train_batch_size")
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def trial_layout(compose: Callable[[Any], DictConfig], candidate) -> Any:
    """The TrialLayout a candidate's job trains: its task config, `compose(candidate)`, as the job's own checks
    (check_train_job, which `run()` repeats when the job starts) leave it.

    Those checks re-derive the batch where launcher.nproc_per_node=auto starts several CPU workers: the recipe's
    one-rank global batch is kept, the micro-batch (or the accumulation) divided by the workers
    (dsrecipes.config.auto_workers). The candidate's micro-batch is per rank (the memory estimate's), so the
    trial pins the worker count instead (launcher.nproc_per_node=N, that warning's own advice): each rank then
    trains the candidate's micro-batch with the recipe's accumulation. ValueError: a check refuses the recipe."""
    from dsrecipes.config.preflight import check_train_job
    from dsrecipes.profiling.autotuning.space import TrialLayout

    job = compose(candidate)
    given = [job.trainer[key] for key in BATCH_KEYS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each job shows its own warnings when it runs
        _, batch, nproc, _ = check_train_job(job)
    rederived = [job.trainer[key] for key in BATCH_KEYS] != given
    if rederived and candidate.workers is None and str(job.launcher.nproc_per_node) == "auto":
        return trial_layout(compose, replace(candidate, workers=nproc))
    return TrialLayout(candidate, nproc, batch.micro_batch_size, batch.gradient_accumulation_steps, batch.train_batch_size)


def trial_overrides(cfg: AutotuneConfig) -> list[str]:
    """What every trial adds: train end_profile_step steps, log every start_profile_step (so the windows after the
    warm-up are the measured ones), metrics.jsonl only, no evaluation beyond one batch, no checkpoint, export or sample."""
    return [f"trainer.max_steps={cfg.end_profile_step}", f"trainer.log_interval={cfg.start_profile_step}",
            "trainer.eval_interval=0", "trainer.eval_batches=1", "trainer.sample_tokens=0", "trainer.progress_bar=false",
            "trainer.resume=null", "checkpoint.save_final=false", "checkpoint.interval=0",
            "checkpoint.export_safetensors=false", "logger=jsonl"]


class AutotuneSweeper(Sweeper):
    def __init__(self, **keys: Any) -> None:
        names = {f.name for f in fields(AutotuneConfig)}
        values = {k: (list(v) if k == "zero_stages" else v) for k, v in keys.items() if k in names}
        self.autotune = AutotuneConfig(**values)
        self.config: DictConfig | None = None
        self.launcher = None
        self.hydra_context: HydraContext | None = None
        self.job_idx = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        from dsrecipes.utils.errors import USER_ERRORS, exit_on_user_error

        try:
            return self._sweep(list(arguments))
        except USER_ERRORS as error:
            exit_on_user_error(error, prefix="autotune: ")

    # ------------------------------------------------------------------ the Hydra side of a search
    def _sweep(self, arguments: list[str]):
        from dsrecipes.config.preflight import task_config
        from dsrecipes.config.validate import to_root
        from dsrecipes.profiling.autotuning.config import validate_autotune_config
        from dsrecipes.profiling.autotuning.recipe import recipe_facts
        from dsrecipes.profiling.autotuning.session import autotune

        assert self.config is not None and self.hydra_context is not None
        validate_autotune_config(self.autotune)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        parsed = parser.parse_overrides(arguments)
        for override in parsed:
            if override.is_sweep_override():
                raise ValueError(f"{override.input_line} is a sweep; the autotune sweeper chooses zero.stage and the "
                                 "micro-batch itself (hydra.sweeper.zero_stages, hydra.sweeper.*_micro_batch_size_per_gpu) "
                                 "and takes fixed values for everything else")
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        fixed = arguments + trial_overrides(self.autotune)
        loader = self.hydra_context.config_loader

        def compose(candidate) -> DictConfig:
            job = loader.load_sweep_config(self.config, fixed + candidate.overrides())
            with open_dict(job):
                job.hydra.job.num = self.job_idx
            return task_config(job)

        layouts: dict = {}

        def validate(candidate):  # the group probes and the planned candidates share their smallest micro-batch
            if candidate not in layouts:
                layouts[candidate] = trial_layout(compose, candidate)
            return layouts[candidate]

        base = to_root(task_config(loader.load_sweep_config(self.config, fixed)))
        report = autotune(self.autotune, recipe_facts(base), validate, lambda c: self._run_trial(fixed, c, sweep_dir),
                          sweep_dir, self._best_inputs(parsed, arguments, base.name))
        return report

    def _run_trial(self, fixed: list[str], candidate, sweep_dir: Path):
        from dsrecipes.profiling.autotuning.session import TrialRun

        job = self.job_idx
        self.job_idx += 1
        error, job_dir = None, sweep_dir / str(job)
        try:
            (ret,) = self.launcher.launch([fixed + candidate.overrides()], initial_job_idx=job)
        except SystemExit as stop:  # a job's one-line user error (dsrecipes: error: ...) exits; record it, go on
            return TrialRun(str(job), job_dir, f"the job exited with status {stop.code} (see its log in {job_dir})")
        if ret.hydra_cfg is not None:
            job_dir = Path(str(ret.hydra_cfg.hydra.runtime.output_dir))
        if ret.status != JobStatus.COMPLETED:
            cause = ret._return_value
            first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
            error = f"{type(cause).__name__}: {first}"[:300]
        return TrialRun(str(job), job_dir, error)

    def _best_inputs(self, parsed, arguments: list[str], run_name: str):
        """The user's command line as an experiment: +experiment=X as a defaults entry, group choices as overrides
        in the defaults list, values in the body (hydra.* and the keys a candidate sets are left out)."""
        from dsrecipes.profiling.autotuning.session import BestInputs

        choices = OmegaConf.to_container(self.config.hydra.runtime.choices) if self.config is not None else {}
        best = BestInputs(run_name=f"{run_name}_autotuned", command_line=" ".join(arguments))
        for override in parsed:
            key = override.key_or_group
            if override.is_hydra_override() or key.startswith("hydra"):
                continue
            if override.is_delete() or override.package:
                warnings.warn(f"autotune: {override.input_line} is not carried into the best experiment", stacklevel=2)
            elif key == "experiment":
                best.experiments.append(str(override.value()))
            elif key in choices:
                best.group_choices.append((key, str(override.value()), override.is_add()))
            elif key in TUNED_KEYS:
                warnings.warn(f"autotune: {override.input_line} is replaced by each candidate's value", stacklevel=2)
            else:
                best.values[key] = override.value()
        return best


def register() -> None:
    """Make the sweeper known to Hydra where its namespace scan cannot list this package: setuptools' editable
    installs (pip install -e) put a path hook, not a directory, on hydra_plugins.__path__. Idempotent."""
    from hydra.core.plugins import Plugins

    Plugins.instance().register(AutotuneSweeper)
