"""Registers the recipe schema in Hydra's ConfigStore and composes configs outside @hydra.main."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from dsrecipes.config.schema import RootConfig

SCHEMA_NAME = "dsrecipes_schema"
CONFIG_MODULE = "dsrecipes.conf"


def register_configs() -> None:
    """Idempotent: store RootConfig as `dsrecipes_schema`, the first entry of conf/config.yaml's defaults."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=RootConfig)


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
