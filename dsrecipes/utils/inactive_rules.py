""""Set but ignored" rules, declared on the config schema whose keys they govern.

A schema (a config group's dataclass, or a section inside one) lists, as the class attribute `INACTIVE`,
when some of its keys have no effect because the group or the mode that reads them is off:

    @dataclass
    class MoEConfig:
        INACTIVE: ClassVar[tuple[Inactive, ...]] = (
            Inactive(lambda root, moe: not moe.enabled, lambda root, path: f"{path} is off ...", but=("num_experts",)),
        )

dsrecipes.config.inactive walks the recipe's sections and warns once per such key set away from its default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Inactive:
    """When `off(root, section)`, the section's keys (all of its fields but `but`, or only `keys`) have no effect;
    `why(root, path)` says why, `path` being the section's dotted name (e.g. `compression.row_pruning`)."""

    off: Callable[[Any, Any], bool]
    why: Callable[[Any, str], str]
    keys: tuple[str, ...] | None = None
    but: tuple[str, ...] = ()


def switched_off(flag: str = "enabled", hint: str = "") -> Inactive:
    """The section's keys do nothing while its boolean `flag` is false: `<path>.<flag>=false<hint>`."""
    return Inactive(lambda root, section: not getattr(section, flag),
                    lambda root, path: f"{path}.{flag}=false{hint}", but=(flag,))
