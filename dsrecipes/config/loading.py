"""Turns whatever a library user passes as `config=` into a validated RootConfig.

Accepted: None (defaults), a dict or DictConfig (merged onto the schema, so typos fail), a path to
a YAML file, or a list of Hydra overrides (composed from conf/ exactly as the CLI would).

DeepSpeed configs too (dsrecipes.config.ds_import): a path ending in .json (or .hjson), a dict that
is one (it has a key only DeepSpeed has, such as train_batch_size or zero_optimization, or an
optimizer block with `type`), or a dsrecipes dict with `deepspeed_config` (a path or a DeepSpeed
dict) beside its own keys, which win over the translation (an optimizer / lr_scheduler `name` other
than the one the DeepSpeed config picks drops its block). A key that cannot be honoured is a
ValueError naming it; `report=True` prints what became of every key, once (rank 0).

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

from dsrecipes.config.ds_import.files import is_deepspeed_path
from dsrecipes.config.schema import RootConfig
from dsrecipes.training.config import OPTION_SCHEMAS, option_schema, to_dictconfig
from dsrecipes.training.option_schemas import ExtraArguments


def load_config(config=None, report: bool = False) -> DictConfig:
    """A DictConfig typed by RootConfig; unknown keys or wrong types raise with the full key.

    report: print the report of a DeepSpeed config's translation (dsrecipes.initialize does).
    """
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
        user = {"deepspeed_config": str(path)} if is_deepspeed_path(path) else OmegaConf.load(path)
    elif isinstance(config, (dict, DictConfig)):
        user = config
    else:
        raise TypeError(
            f"config must be None, a dict, a DictConfig, a YAML path or a list of overrides; got {type(config).__name__}"
        )
    user = with_deepspeed_config(user, report)
    return OmegaConf.merge(schema_for(user), user)


def with_deepspeed_config(user: Mapping[str, Any], report: bool = False) -> Mapping[str, Any]:
    """`user` with a DeepSpeed config in it translated: the whole dict if it is one, or its `deepspeed_config`
    (a path or a dict) merged under the rest of its keys. Anything else is returned as it is."""
    from dsrecipes.config.ds_import import load_translation, looks_like_deepspeed
    from dsrecipes.config.ds_import.report import print_report

    plain = OmegaConf.to_container(user) if isinstance(user, DictConfig) else user
    if looks_like_deepspeed(plain):
        source, rest = dict(plain), {}
    elif plain.get("deepspeed_config") is not None:
        source = plain["deepspeed_config"]
        rest = dict(plain) if isinstance(source, str) else {k: v for k, v in plain.items() if k != "deepspeed_config"}
    else:
        return user
    name = source if isinstance(source, str) else "(dict)"
    translation = load_translation(source, name=name, recipe=rest)
    picks = {group: rest[group]["name"] for group in OPTION_SCHEMAS
             if isinstance(rest.get(group), Mapping) and rest[group].get("name") is not None}
    translation.give_way(picks, "the config's own keys")
    if report:
        print_report(translation, name)
    return OmegaConf.merge(OmegaConf.create(translation.as_config()), OmegaConf.create(rest))


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
