"""Reuses Hydra's work across compositions that choose the same config-group options.

Hydra composes a recipe in two steps: it builds the defaults list from the group choices (`model=gpt_tiny`,
`+experiment=gpt_zero3`) and merges the ~30 files it names, then applies the value overrides (`zero.stage=2`) to
the merged config (ConfigLoaderImpl._load_configuration_impl). The first step is ~95% of a composition's
~0.2 s and depends only on the group choices, the packaged YAML files and the ConfigStore. So compose() keeps the
merged config per set of group choices (Hydra's own composition with only those overrides), and for each call
applies the value overrides to a copy with Hydra's own ConfigLoaderImpl._apply_overrides_to_config: ~10 ms.
verify, estimate, the benchmarks and the tests compose hundreds of recipes that differ only in values.

Anything outside that split composes through Hydra as before: overrides of `hydra.*` (a search path can add
groups), sweeps, and group choices that do not merge; a bad value override raises from Hydra's own step on the
same config. So every error a user sees is Hydra's own message. A cached merge is keyed by the group overrides
and by the identity of every ConfigStore node, so a DeepSpeed import stored again with other contents
(dsrecipes.config.ds_import) is merged afresh; the packaged YAML files are taken not to change while a process
runs. Each call gets its own copy, with no resolver cache (Hydra's `now` resolves at the copy's own time).
"""

from __future__ import annotations

import copy
from collections import OrderedDict

from omegaconf import DictConfig, OmegaConf

CACHED_MERGES = 64  # group-choice sets kept per process (gpt_3d_moe's merge pickles to about 37 kB)
_merges: OrderedDict[tuple, DictConfig] = OrderedDict()


def _store_fingerprint() -> tuple[int, ...]:
    """The identity of every node in Hydra's ConfigStore: storing a node again under any name changes it."""
    from hydra.core.config_store import ConfigStore

    ids: list[int] = []

    def walk(tree: dict) -> None:
        for value in tree.values():
            walk(value) if isinstance(value, dict) else ids.append(id(value))

    walk(ConfigStore.instance().repo)
    return tuple(ids)


def split_overrides(overrides: list[str]) -> tuple[list[str], list] | None:
    """(group overrides' input lines, parsed value overrides) as Hydra's defaults list classifies them
    (hydra._internal.defaults_list.Overrides), or None where only Hydra's full composition is faithful."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    repository = GlobalHydra.instance().config_loader().repository
    groups: list[str] = []
    values: list = []
    for override in OverridesParser.create().parse_overrides(overrides=overrides):
        if override.is_sweep_override() or override.key_or_group.split("/")[0].split(".")[0] == "hydra":
            return None
        if isinstance(override.value(), dict) or not repository.group_exists(override.key_or_group):
            values.append(override)
        else:
            groups.append(override.input_line)
    return groups, values


def compose_from_merge(config_name: str, overrides: list[str], compose_groups) -> DictConfig | None:
    """The recipe `compose_groups(group_overrides)` merges, with the value overrides applied to a copy; None where
    the shortcut does not apply or the merge raised (the caller then composes through Hydra, which names the
    error). A bad value override raises from the same Hydra function, on the same config, as a full composition.

    Must run inside an initialized Hydra (hydra.initialize_config_module), as hydra.compose does."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    try:
        split = split_overrides(overrides)
        if split is None:
            return None
        groups, values = split
        key = (config_name, tuple(groups), _store_fingerprint())
        if key not in _merges:
            _merges[key] = compose_groups(groups)
            while len(_merges) > CACHED_MERGES:
                _merges.popitem(last=False)
        _merges.move_to_end(key)
    except Exception:  # noqa: BLE001 - Hydra's full composition raises the same error with its own message
        return None
    config = copy.deepcopy(_merges[key])
    # resolvers with a cache (Hydra's `now`, run_stamp) keep it per config: a copy starts with none, as a new
    # composition would, instead of the first composition's times
    OmegaConf.clear_cache(config)
    ConfigLoaderImpl._apply_overrides_to_config(values, config)  # Hydra's own step: its errors are Hydra's
    return config


def clear() -> None:
    """Forget every cached merge (tests compare against Hydra's uncached composition)."""
    _merges.clear()
