"""Checks of a job's command-line overrides as typed, which the composed config can no longer show.

OmegaConf converts some values on their way into a typed field: a boolean key takes `2` (or `yes`, `on`, `1`)
as true, so `logger.jsonl=2` composes as if the user had written `logger.jsonl=true`. The composed config holds
only the converted value, so the Preflight callback (dsrecipes.config.preflight) asks the overrides themselves:
a boolean key set to anything but true / false (or null where the key may be null) is refused, naming the key,
the value and the valid choices.
"""

from __future__ import annotations

from collections.abc import Iterable

from omegaconf import DictConfig, OmegaConf


def check_override_values(overrides: Iterable[str], cfg: DictConfig) -> None:
    """ValueError for the first override (Hydra's `key=value` text) that sets a boolean key of cfg (the composed
    config the overrides produced) to a value that is not a boolean."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    parser = OverridesParser.create()
    for text in overrides:
        override = parser.parse_override(text)
        if override.type == OverrideType.DEL or override.is_sweep_override() or override.package is not None:
            continue
        key = override.key_or_group
        if not isinstance(OmegaConf.select(cfg, key, throw_on_missing=False, default=None), bool):
            continue
        value = override.value()
        if value is None or isinstance(value, bool):
            continue
        raise ValueError(f"{key}={override.get_value_element_as_str()} is not valid: {key} is a boolean; "
                         f"choose one of: true, false")


def job_overrides(config: DictConfig) -> list[str]:
    """The job's overrides as Hydra recorded them (hydra.overrides.task), or none where the config has no hydra node."""
    task = OmegaConf.select(config, "hydra.overrides.task", default=None)
    return [] if task is None else [str(text) for text in task]
