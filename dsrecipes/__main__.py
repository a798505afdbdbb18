"""Command-line entry of dsrecipes: compose a Hydra recipe and train it.

    python -m dsrecipes                                     # default recipe: small GPT, built-in corpus
    python -m dsrecipes +experiment=gpt_zero3               # a named experiment
    python -m dsrecipes model=llama_debug precision=bf16 optimizer.lr=3e-4 trainer.max_steps=200
    python -m dsrecipes -m optimizer.lr=1e-3,3e-3 trainer.max_steps=20   # Hydra multirun sweep
    python -m dsrecipes -m hydra/sweeper=optuna optimized_metric=val/loss 'optimizer.lr=interval(1e-4,1e-2)' \
        hydra.sweeper.n_trials=8                            # Optuna search; each job returns val/loss
    python -m dsrecipes --help                              # config groups and their options, the tools
    python -m dsrecipes --cfg job --package zero            # one group's keys and values (--cfg job: the whole recipe)
    python -m dsrecipes report                              # versions, devices, features that run here (ds_report)
    python -m dsrecipes deepspeed_config=ds_config.json trainer.max_steps=200   # a DeepSpeed config, overrides on top
    python -m dsrecipes mode=generate checkpoint=outputs/<date>/<time>_gpt prompt="Once upon"   # inference
"""

from __future__ import annotations

import os
import sys
import warnings
from datetime import datetime
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from dsrecipes.config.store import register_configs

register_configs()
try:  # hydra/sweeper=autotune: Hydra's plugin scan misses it under an editable install (pip install -e)
    from hydra_plugins.dsrecipes_autotune.autotune_sweeper import register as register_autotune_sweeper
except ImportError:  # not installed alongside (a vendored copy of dsrecipes without its plugin package)
    pass
else:
    register_autotune_sweeper()


_job_started = False  # set by the first job: a Hydra exit before it is a composition failure


@hydra.main(config_path="pkg://dsrecipes.conf", config_name="config", version_base="1.3")
def run(cfg: DictConfig) -> dict | float:
    """One Hydra job: validate the whole recipe first, then train in this process or in spawned workers.

    Returns the run summary, or with `optimized_metric` set that metric's value (the objective of hydra/sweeper=optuna).
    """
    global _job_started
    _job_started = True
    from omegaconf import OmegaConf
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from dsrecipes.config.optimized_metric import check_optimized_metric, optimized_value
    from dsrecipes.config.preflight import check_train_job
    from dsrecipes.launch.workers import spawn_workers, worker_main
    from dsrecipes.utils.errors import USER_ERROR_EXIT_CODE, USER_ERRORS, exit_on_user_error
    from dsrecipes.utils.interrupts import exit_code, received_signal, signal_name, stop_on_signals

    stop_on_signals()
    try:
        metric = cfg.get("optimized_metric")
        check_optimized_metric(metric, str(cfg.mode))
        if cfg.mode != "train":  # generate / serve-bench: the inference engine, no training
            from dsrecipes.inference_cli import run_inference_mode

            return run_inference_mode(cfg, HydraConfig.get().runtime.output_dir, list(HydraConfig.get().overrides.task))
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            root, batch, nproc, joined = check_train_job(cfg)  # the Preflight callback ran it before the run dir
        hydra_cfg = HydraConfig.get()
        run_dir = hydra_cfg.runtime.output_dir
        overrides = list(hydra_cfg.overrides.task)
        sweep_name = Path(hydra_cfg.sweep.dir).name if hydra_cfg.mode == RunMode.MULTIRUN else None
        if joined or nproc > 1 or cfg.launcher.nnodes > 1:
            config = OmegaConf.to_container(cfg, resolve=True)
            if joined:
                summary = worker_main(config, run_dir, overrides, sweep_name)
            else:
                summary = spawn_workers(nproc, cfg.launcher.max_restarts, config, run_dir, overrides, sweep_name)
        else:
            from dsrecipes.training.trainer import Trainer  # only where this process trains (workers import their own)

            summary = Trainer(root, run_dir, batch, overrides=overrides, sweep_name=sweep_name).fit()
        # a sweeper that optimises (hydra/sweeper=optuna) takes the job's return value as the objective
        return summary if metric is None else optimized_value(metric, summary, run_dir)
    except USER_ERRORS as error:
        exit_on_user_error(error)
    except ChildFailedError as error:
        if all(failure.exitcode == USER_ERROR_EXIT_CODE for failure in error.failures.values()):
            sys.exit(USER_ERROR_EXIT_CODE)  # the worker printed its one-line error already
        raise
    except (KeyboardInterrupt, SignalException) as interruption:
        signum = getattr(interruption, "sigval", None) or received_signal()
        print(f"dsrecipes: stopped by {signal_name(signum)}", file=sys.stderr, flush=True)
        sys.exit(exit_code(signum))


def _compose(overrides: list[str]):
    from dsrecipes.config.store import compose  # imported where a deepspeed_config= file needs it: --help stays light

    return compose(overrides)


def main() -> None:
    """Console entry. Under a launcher (torchrun, srun), ranks agree on one run directory first.

    `report` as the first argument prints the environment report (dsrecipes.report) instead of running Hydra;
    `--help` / `-h` prints dsrecipes' own help (dsrecipes.cli_help: no composition, no torch; `--hydra-help` is Hydra's).
    """
    from dsrecipes.cli_help import print_help_and_exit, recipe_help, wants_help

    if wants_help(sys.argv[1:]):
        print_help_and_exit(recipe_help())
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        from dsrecipes.report import main as report_main

        sys.exit(report_main(sys.argv[2:]))
    from dsrecipes.config.ds_import.cli import apply_deepspeed_argument
    from dsrecipes.config.run_directory import RUN_STAMP_ENV
    from dsrecipes.launch.environment import under_launcher
    from dsrecipes.utils.errors import USER_ERRORS, exit_on_user_error

    if under_launcher():  # torchrun, srun: launch and torch.distributed imported only here (`--help` imports no torch)
        import torch.distributed

        from dsrecipes.launch.workers import join_launcher_group

        if join_launcher_group():
            stamp = [datetime.now().isoformat()]
            torch.distributed.broadcast_object_list(stamp, src=0)
            os.environ[RUN_STAMP_ENV] = stamp[0]
            if torch.distributed.get_rank() != 0:
                sys.argv.append("hydra.output_subdir=null")  # .hydra/ is written once, by rank 0
    from dsrecipes.config.override_values import check_override_syntax
    from dsrecipes.inference_cli import rewrite_aliases

    try:  # a value Hydra cannot parse: its reason and the override quoted, before anything starts
        check_override_syntax(sys.argv[1:])
    except USER_ERRORS as error:
        exit_on_user_error(error)
    sys.argv[1:] = rewrite_aliases(sys.argv[1:])  # mode=generate checkpoint=PATH prompt=TEXT
    try:  # deepspeed_config=PATH: translated and registered as an experiment the overrides apply on top of
        sys.argv[1:] = apply_deepspeed_argument(sys.argv[1:], _compose)
    except USER_ERRORS as error:
        exit_on_user_error(error)
    try:
        run()
    except SystemExit as exit_:
        if exit_.code == 1 and not _job_started:  # Hydra could not compose: an unknown key gets its closest keys
            from dsrecipes.config.unknown_key_hint import explain_composition_failure

            explain_composition_failure(sys.argv[1:])
        raise


if __name__ == "__main__":
    main()
