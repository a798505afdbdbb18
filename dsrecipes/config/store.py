"""Registers the recipe schema in Hydra's ConfigStore and composes configs outside @hydra.main."""

from __future__ import annotations

import os
from datetime import datetime

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from dsrecipes.config.schema import RootConfig

SCHEMA_NAME = "dsrecipes_schema"
CONFIG_MODULE = "dsrecipes.conf"


def run_stamp(fmt: str) -> str:
    """`${run_stamp:%H-%M-%S}`: the run's start time, one value per run even across ranks.

    Under a launcher rank 0's time is shared through DSRECIPES_RUN_STAMP (Hydra's `now` would give
    each rank its own directory); otherwise the first call's time, cached for the process.
    """
    shared = os.environ.get("DSRECIPES_RUN_STAMP")
    if shared:
        return datetime.fromisoformat(shared).strftime(fmt)
    if not _STAMP:
        _STAMP.append(datetime.now())
    return _STAMP[0].strftime(fmt)


_STAMP: list[datetime] = []


def register_configs() -> None:
    """Idempotent: store RootConfig as `dsrecipes_schema` (first in conf/config.yaml's defaults), add resolvers."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=RootConfig)
    if not OmegaConf.has_resolver("run_stamp"):
        OmegaConf.register_new_resolver("run_stamp", run_stamp)


def compose(overrides: list[str] | None = None, return_hydra_config: bool = False):
    """Compose conf/config.yaml with command-line style overrides, as `python -m dsrecipes` would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides or []), return_hydra_config=return_hydra_config)
