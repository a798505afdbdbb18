"""Keys that a recipe sets but that have no effect, because the group or mode that reads them is off.

`moe.k=2` with `moe=none`, `precision.loss_scale=128` with dtype fp32, `logger.wandb_project=x` with
wandb off: the run is valid, but the key does nothing, which is almost always a mistake (a missing
group option on the command line). Each such key is reported as one UserWarning naming the key,
its value and what would make it count; it is not an error, since the run does what the rest of the
recipe says and a shared base config may well carry keys that only some of its runs use.

A key counts as set when its value differs from the schema's default (the values alone decide,
so the check works the same for the CLI and for `dsrecipes.initialize(config=...)`). The rules live on the
schemas whose keys they govern (their `INACTIVE` attribute, dsrecipes.utils.inactive_rules); this module walks
the recipe's sections and asks each.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from dsrecipes.utils.inactive_rules import Inactive


def _sections(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(dotted path, object) of every config dataclass under node, node itself first (path "" for the root)."""
    yield path, node
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _sections(value, f"{path}.{f.name}" if path else f.name)


def _section_keys(section: Any, rule: Inactive) -> Iterable[str]:
    names = [f.name for f in dataclasses.fields(section) if not f.metadata.get("omegaconf_ignore")]
    return [n for n in names if n not in rule.but] if rule.keys is None else [n for n in rule.keys if n in names]


def _changed(value: Any, default: Any) -> bool:
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return list(value) != list(default)
    return value != default


def inactive_keys(root: Any) -> list[tuple[str, Any, str]]:
    """(key, value, why it has no effect) for every key of root (a RootConfig) set away from its default
    in a group or mode that is off: the `INACTIVE` rules each section's schema declares."""
    found: list[tuple[str, Any, str]] = []
    seen: set[str] = set()
    for path, section in _sections(root, ""):
        for rule in getattr(type(section), "INACTIVE", ()):
            if not rule.off(root, section):
                continue
            default = type(section)()
            for name in _section_keys(section, rule):
                key = f"{path}.{name}"
                value = getattr(section, name)
                if key not in seen and _changed(value, getattr(default, name)):
                    seen.add(key)
                    found.append((key, value, rule.why(root, path)))
    return found


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return "null" if value is None else str(value)


def warn_inactive_keys(root: Any) -> None:
    """One UserWarning per key that is set but has no effect (see inactive_keys)."""
    for key, value, reason in inactive_keys(root):
        warnings.warn(f"{key}={_show(value)} has no effect: {reason}", stacklevel=3)
