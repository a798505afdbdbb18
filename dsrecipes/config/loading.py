"""Turns whatever a library user passes as `config=` into a validated RootConfig.

Accepted: None (defaults), a dict or DictConfig (merged onto the schema, so typos fail), a path to
a YAML file, or a list of Hydra overrides (composed from conf/ exactly as the CLI would).
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from dsrecipes.config.schema import RootConfig


def load_config(config=None) -> DictConfig:
    """A DictConfig typed by RootConfig; unknown keys or wrong types raise with the full key."""
    base = OmegaConf.structured(RootConfig)
    if config is None:
        return base
    if isinstance(config, RootConfig):
        return OmegaConf.structured(config)
    if isinstance(config, (list, tuple)):
        from dsrecipes.config.store import compose

        composed = compose(list(config))
        return OmegaConf.merge(base, composed)
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if not path.exists():
            raise FileNotFoundError(f"config file {path} does not exist")
        return OmegaConf.merge(base, OmegaConf.load(path))
    if isinstance(config, (dict, DictConfig)):
        return OmegaConf.merge(base, config)
    raise TypeError(
        f"config must be None, a dict, a DictConfig, a YAML path or a list of overrides; got {type(config).__name__}"
    )
