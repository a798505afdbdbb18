"""Command-line entry of dsrecipes: compose a Hydra recipe and train it.

    python -m dsrecipes                                     # default recipe: small GPT, built-in corpus
    python -m dsrecipes +experiment=gpt_zero3               # a named experiment
    python -m dsrecipes model=llama_debug precision=bf16 optimizer.lr=3e-4 trainer.max_steps=200
    python -m dsrecipes -m optimizer.lr=1e-3,3e-3 trainer.max_steps=20   # Hydra multirun sweep
    python -m dsrecipes --help                              # config groups and their options
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from dsrecipes.config.store import register_configs

register_configs()


@hydra.main(config_path="pkg://dsrecipes.conf", config_name="config", version_base="1.3")
def run(cfg: DictConfig) -> dict:
    """One Hydra job: validate the whole recipe first, then train."""
    from dsrecipes.config.validate import validate_recipe
    from dsrecipes.training.trainer import Trainer

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            root, batch = validate_recipe(cfg)
        hydra_cfg = HydraConfig.get()
        sweep_name = Path(hydra_cfg.sweep.dir).name if hydra_cfg.mode == RunMode.MULTIRUN else None
        trainer = Trainer(
            root, hydra_cfg.runtime.output_dir, batch, overrides=list(hydra_cfg.overrides.task), sweep_name=sweep_name
        )
        return trainer.fit()
    except (ValueError, FileNotFoundError, FloatingPointError) as error:
        exit_on_user_error(error)


def exit_on_user_error(error: Exception) -> None:
    """A recipe mistake ends the run with its message, not a traceback (DSRECIPES_DEBUG=1 re-raises)."""
    if os.environ.get("DSRECIPES_DEBUG") or os.environ.get("HYDRA_FULL_ERROR"):
        raise error
    print(f"dsrecipes: error: {error}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    run()


if __name__ == "__main__":
    main()
