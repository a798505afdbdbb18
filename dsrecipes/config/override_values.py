"""Checks of a job's command-line overrides as typed, which the composed config can no longer show.

OmegaConf converts some values on their way into a typed field: a boolean key takes `2` (or `yes`, `on`, `1`)
as true, so `logger.jsonl=2` composes as if the user had written `logger.jsonl=true`. The composed config holds
only the converted value, so the Preflight callback (dsrecipes.config.preflight) asks the overrides themselves:
a boolean key set to anything but true / false (or null where the key may be null) is refused, naming the key,
the value and the valid choices.

Hydra's `+` (and `++`) adds a key even where a group's schema has none, so `+trainer.max_stepz=30` trains with
trainer.max_steps untouched and no word, and `+zero.overlap_comm=true` sets a key nothing reads. A `+` that adds
a key the schema of its node lacks is refused, naming the node's keys (the closest first). Nodes that take any
key (optimizer=custom, lr_scheduler=custom: not in struct mode) and root-level adds (`+experiment=...`, a group)
are left to Hydra.

A value Hydra's override grammar cannot parse (`prompt=def main(`: parentheses, brackets, commas and quotes mean
something to it) is refused before Hydra starts, with Hydra's parse error and one line that shows the override
quoted for Hydra inside the shell's quotes (`"prompt='def main('"`).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Iterable

from omegaconf import DictConfig, OmegaConf

from dsrecipes.config.unknown_key_hint import OPTIONS_WITH_VALUE, closest_keys_hint, schema_keys


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
        if override.type in (OverrideType.ADD, OverrideType.FORCE_ADD):
            _check_added_key(key, override, cfg)
        if not isinstance(OmegaConf.select(cfg, key, throw_on_missing=False, default=None), bool):
            continue
        value = override.value()
        if value is None or isinstance(value, bool):
            continue
        raise ValueError(f"{key}={override.get_value_element_as_str()} is not valid: {key} is a boolean; "
                         f"choose one of: true, false")


def _check_added_key(key: str, override, cfg: DictConfig) -> None:
    """ValueError when `+key=value` adds a key that the schema (a dataclass) of its struct-mode node does not have."""
    parent_key, _, leaf = key.rpartition(".")
    if not parent_key or parent_key.split(".")[0] == "hydra":
        return
    parent = OmegaConf.select(cfg, parent_key, throw_on_missing=False, default=None)
    if not isinstance(parent, DictConfig) or not parent._get_flag("struct"):
        return
    schema = parent._metadata.object_type
    if not dataclasses.is_dataclass(schema):
        return
    names = schema_keys(schema)
    if leaf in names:
        return
    raise ValueError(f"{override.input_line} is not valid: {parent_key} has no key {leaf!r} (`+` adds a key that "
                     f"nothing reads); {closest_keys_hint(parent_key, leaf, names)}{parent_key}'s keys: "
                     f"{', '.join(sorted(names))}")


def check_override_syntax(args: Iterable[str]) -> None:
    """ValueError for the first command-line override Hydra's grammar cannot parse: Hydra's reason, and the
    override quoted so that it parses (the value in Hydra's quotes, the whole in the shell's)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser, takes_value = OverridesParser.create(), False
    for arg in args:
        if takes_value or arg.startswith("-") or "=" not in arg:
            takes_value = arg in OPTIONS_WITH_VALUE
            continue
        try:
            parser.parse_overrides([arg])  # wraps the grammar's errors as OverrideParseException
        except OverrideParseException as error:
            lines = [line for line in str(error).splitlines()
                     if line.strip() and not line.startswith(("Error parsing override", "See https://"))]
            reason = lines[0] if lines else "not Hydra's override grammar"
            raise ValueError(f"cannot parse the override {arg!r}: {reason}\n  quote the value: {quoted_override(arg)}"
                             f"  (Hydra's override grammar: https://hydra.cc/docs/advanced/override_grammar/basic)"
                             ) from None


def quoted_override(arg: str) -> str:
    """`key=value` as a shell word whose value Hydra reads as one quoted string: "prompt='def main('"
    (a value with a ' in it: "prompt=\\"it's\\"")."""
    key, _, value = arg.partition("=")
    quote = "'" if "'" not in value or '"' in value else '"'
    for_hydra = f"{key}={quote}" + value.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote
    if any(c in for_hydra for c in "!$`"):  # the shell would expand these inside double quotes
        return shlex.quote(for_hydra)
    for_shell = for_hydra.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{for_shell}"'


def job_overrides(config: DictConfig) -> list[str]:
    """The job's overrides as Hydra recorded them (hydra.overrides.task), or none where the config has no hydra node."""
    task = OmegaConf.select(config, "hydra.overrides.task", default=None)
    return [] if task is None else [str(text) for text in task]
