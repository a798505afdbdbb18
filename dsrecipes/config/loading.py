"""Turns whatever a library user passes as `config=` into a validated RootConfig.

Accepted: None (defaults), a dict or DictConfig (merged onto the schema, so typos fail), a path to
a YAML file, or a list of Hydra overrides (composed from conf/ exactly as the CLI would).

The optimizer and lr_scheduler groups have one schema per option. On the command line the option
is chosen in the defaults list (`optimizer=sgd`); here it is the group's `name` key
(`{"optimizer": {"name": "sgd", "momentum": 0.9}}`), the group's default option (adamw,
warmup_cosine) when there is none. The user's keys are merged into that option's schema, so a key
it does not take fails naming the key and the schema (`Key 'momentum' not in 'AdamWConfig'`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dsrecipes.config.schema import RootConfig
from dsrecipes.training.config import OPTION_SCHEMAS, ExtraArguments, option_schema, to_dictconfig


def load_config(config=None) -> DictConfig:
    """A DictConfig typed by RootConfig; unknown keys or wrong types raise with the full key."""
    if config is None:
        return OmegaConf.structured(RootConfig)
    if isinstance(config, RootConfig):
        return to_dictconfig(config)
    if isinstance(config, (list, tuple)):
        from dsrecipes.config.store import compose

        user = compose(list(config))
    elif isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if not path.exists():
            raise FileNotFoundError(f"config file {path} does not exist")
        user = OmegaConf.load(path)
    elif isinstance(config, (dict, DictConfig)):
        user = config
    else:
        raise TypeError(
            f"config must be None, a dict, a DictConfig, a YAML path or a list of overrides; got {type(config).__name__}"
        )
    return OmegaConf.merge(schema_for(user), user)


def schema_for(user: Mapping[str, Any]) -> DictConfig:
    """RootConfig's schema with each option group typed by the option `user` chooses (its `name`, else the default)."""
    base = OmegaConf.structured(RootConfig)
    for group in OPTION_SCHEMAS:
        node = user.get(group)
        if dataclasses.is_dataclass(node) and not isinstance(node, type):  # a schema object names its own type
            schema = type(node)
        else:
            schema = option_schema(group, node.get("name") if isinstance(node, Mapping) else None)
        base[group] = OmegaConf.structured(schema)
        if issubclass(schema, ExtraArguments):  # a `custom` node takes the class's own keys (see store.option_node)
            OmegaConf.set_struct(base[group], False)
    return base
