"""Every check of a CLI job, run before Hydra creates a run directory and before any worker starts.

Hydra creates the job's directory (and writes .hydra/ into it) before it calls the task function,
so validating inside `run()` alone leaves a directory behind for every bad value, and in a multirun
the second job's bad value is only found once the first job has trained. The `Preflight` callback
(registered in conf/config.yaml's hydra.callbacks) runs the same checks earlier:

* on_run_start (a single run): hydra.run.dir must be creatable, then `check_job` on the recipe;
* on_multirun_start (a sweep): hydra.sweep.dir must be creatable, then every job's config is
  composed, as the sweeper will compose it, and checked, so a bad value in any job stops the sweep
  before the first one starts. Only Hydra's basic sweeper lists its jobs up front; under another
  sweeper (optuna, ...) each job is checked when it starts, by `run()`, but a sweeper that optimises
  the jobs' return value without `optimized_metric` (or with one no run summary holds) is refused here. Under a launcher that runs
  the jobs elsewhere (hydra/launcher=slurm) the world size and files are the remote machine's, so
  only what depends on neither is checked here (every numeric range, the run's path-like names);
  the rest when each job starts.

A failed check prints `dsrecipes: error: <message>` (one line, no traceback) and exits with code 2;
DSRECIPES_DEBUG=1 or HYDRA_FULL_ERROR=1 re-raise it instead. Warnings are left to `run()`, which
repeats the checks and shows them once per job.
"""

from __future__ import annotations

import copy
import os
import warnings
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from dsrecipes.config.override_values import check_override_values, job_overrides
from dsrecipes.utils.errors import USER_ERRORS, exit_on_user_error
from dsrecipes.utils.paths import check_writable_dir

_BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
_BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def check_train_job(cfg: DictConfig) -> tuple[Any, Any, int, bool]:
    """A training job's checks: launcher, process count, the whole recipe. Returns (root, batch sizes, nproc, joined)."""
    import torch

    from dsrecipes.config.auto_workers import keep_recipe_batch, workers_the_batch_allows
    from dsrecipes.config.validate import validate_recipe
    from dsrecipes.distributed.config import check_launcher_backend, resolve_nproc, validate_launcher_config
    from dsrecipes.launch.environment import under_launcher

    validate_launcher_config(cfg.launcher)
    joined = under_launcher()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nnodes = 1 if joined else cfg.launcher.nnodes
    if joined and cfg.launcher.nnodes > 1:
        warnings.warn(f"launcher.nnodes={cfg.launcher.nnodes} has no effect under an outside launcher (torchrun's "
                      "--nnodes, or srun's allocation, sets the nodes)", stacklevel=2)
    nproc = int(os.environ["WORLD_SIZE"]) if joined else resolve_nproc(cfg.launcher, cfg.zero, gpus)
    if not joined:  # auto never starts more CPU workers than the batch can be split over
        nproc, fewer = workers_the_batch_allows(cfg, nproc, gpus)
        if fewer:
            warnings.warn(fewer, stacklevel=2)
    world = nproc * nnodes  # every node starts the same number of workers (as torchrun's --nproc-per-node)
    check_launcher_backend(cfg.launcher, world)
    # may set cfg.trainer's batch triple; a submitit local job (hydra/launcher=slurm_local) stands in for auto
    submitit_local = joined and os.environ.get("SUBMITIT_EXECUTOR") == "local"
    kept = keep_recipe_batch(cfg, world, gpus, "hydra/launcher=slurm_local's job" if submitit_local else None) \
        if not joined or submitit_local else None
    if kept:
        warnings.warn(kept, stacklevel=2)
    if cfg.launcher.max_restarts > 0 and (joined or world == 1):
        where = "under an outside launcher (use its own restart option, e.g. torchrun --max-restarts)" if joined else \
            "with one process, which trains in this process (restarts are for spawned workers)"
        warnings.warn(f"launcher.max_restarts={cfg.launcher.max_restarts} has no effect {where}", stacklevel=2)
    root, batch = validate_recipe(cfg, dp_world_size=world, node_size=None if joined else nproc)
    return root, batch, nproc, joined


def check_inference_job(cfg: DictConfig) -> None:
    """mode=generate / serve-bench: every numeric key, the run name, the generate group and its process count."""
    from dsrecipes.config.validate import check_run_name, to_root
    from dsrecipes.inference.config import validate_generate_config
    from dsrecipes.utils.ranges import check_ranges

    root = to_root(cfg)
    check_ranges(root)
    check_run_name(root.name)
    validate_generate_config(root.generate, str(root.mode))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if root.generate.tp_size != world:
        raise ValueError(f"generate.tp_size={root.generate.tp_size} needs exactly that many processes, but {world} "
                         f"would run; use torchrun --nproc-per-node {root.generate.tp_size} -m dsrecipes mode={root.mode} ...")


def check_portable(cfg: DictConfig) -> None:
    """The checks that hold on any machine: every numeric key's range and the path-like names."""
    from dsrecipes.config.validate import check_run_paths, to_root
    from dsrecipes.utils.ranges import check_ranges

    root = to_root(cfg)
    check_ranges(root)
    check_run_paths(root)


def check_job(cfg: DictConfig) -> int | None:
    """All checks of one job's task config (no `hydra` node), whatever its mode; a training job's global batch."""
    from dsrecipes.config.optimized_metric import check_optimized_metric

    check_optimized_metric(cfg.get("optimized_metric"), str(cfg.mode))
    if cfg.mode == "train":
        return check_train_job(cfg)[1].train_batch_size
    check_inference_job(cfg)
    return None


def task_config(config: DictConfig) -> DictConfig:
    """The job's config without its `hydra` node, as the task function receives it."""
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        task.pop("hydra", None)
    return task


def sweep_jobs(config: DictConfig) -> list[list[str]] | None:
    """Each job's overrides, in the order the basic sweeper launches them; None under another sweeper."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if OmegaConf.select(config, "hydra.sweeper._target_") != _BASIC_SWEEPER:
        return None
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()]
    arguments += list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    return BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)[0]


def check_sweep(config: DictConfig) -> list[tuple[str, int | None]]:
    """hydra.sweep.dir, then every job of the sweep; returns (overrides, global batch) of each job checked
    (the batch is None for inference jobs and where the jobs run elsewhere)."""
    from hydra.core.global_hydra import GlobalHydra

    from dsrecipes.config.optimized_metric import check_sweeper_metric

    check_sweeper_metric(OmegaConf.select(config, "hydra.sweeper._target_"), config.get("optimized_metric"),
                         str(config.get("mode", "train")))
    jobs = sweep_jobs(config)
    if jobs is None:
        check_writable_dir("hydra.sweep.dir", resolved(config, "sweep"))
        return []
    loader = GlobalHydra.instance().config_loader()
    local = OmegaConf.select(config, "hydra.launcher._target_") == _BASIC_LAUNCHER
    checked = []
    for index, overrides in enumerate(jobs):
        job = loader.load_sweep_config(config, list(overrides))
        with open_dict(job):
            job.hydra.job.id = index
            job.hydra.job.num = index
        shown = " ".join(overrides) or "(no overrides)"
        try:
            check_override_values(overrides, job)
            checked.append((shown, (check_job if local else check_portable)(task_config(job))))
        except USER_ERRORS as err:
            raise type(err)(f"multirun job #{index} ({shown}), before any job started: {err}") from err
    check_writable_dir("hydra.sweep.dir", resolved(config, "sweep"))  # after the jobs: resolving claims it
    return checked


def resolved(config: DictConfig, which: str) -> str:
    """hydra.<which>.dir resolved; the run_dir resolver's own error (the directory cannot be made) as a ValueError."""
    from omegaconf.errors import InterpolationResolutionError

    try:
        return str(config.hydra[which].dir)
    except InterpolationResolutionError as error:
        cause = error.__cause__
        if isinstance(cause, USER_ERRORS):
            raise ValueError(str(cause)) from None
        raise


class Preflight(Callback):
    """Checks every job before Hydra creates its directory (see the module docstring)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # the job first: resolving hydra.run.dir claims (creates) the directory (dsrecipes.config.run_directory)
        self._checked(lambda: (check_override_values(job_overrides(config), config), check_job(task_config(config)),
                               check_writable_dir("hydra.run.dir", resolved(config, "run"))))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from dsrecipes.config.auto_workers import unequal_batches_warning

        jobs = self._checked(lambda: check_sweep(config))
        message = unequal_batches_warning([(shown, batch) for shown, batch in jobs if batch is not None])
        if message:  # shown here, once for the sweep, before the first job starts
            warnings.warn(message, stacklevel=2)

    @staticmethod
    def _checked(check):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # run() repeats the checks and shows their warnings
                return check()
        except USER_ERRORS as error:
            exit_on_user_error(error)
