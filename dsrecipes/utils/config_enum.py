"""ConfigEnum: the type of every config field that takes one of a fixed set of strings.

Why: OmegaConf checks an Enum-typed field when a value is composed or merged, so a bad value, in a
YAML file, on the command line (`precision.dtype=fp8`) or in a dict given to
`dsrecipes.initialize(config=...)`, fails at composition, before the run directory is made, with
the full key and the valid values (`Invalid value 'fp8', expected one of [fp32, bf16, fp16]
full_key: precision.dtype`). A plain `str` field would only be caught by a later validator.

A member behaves as its string: the str mixin plus __str__ / __format__ / __repr__ returning the
value make `cfg.dtype == "bf16"`, `in` tuples, dict lookups keyed by the string, f-strings, error
messages and json.dumps work unchanged, and OmegaConf.to_yaml writes the plain value. OmegaConf
converts a string to a member by NAME, so every member's name is its value; values that are not
Python identifiers ("1f1b", "serve-bench") use the functional form, `config_enum(...)`. Code that
builds the dataclasses directly may still pass plain strings (`ModelConfig(style="llama")`); the
groups' validate_* functions check those.

yaml.safe_dump and torch.load(weights_only=True) do not take Enum objects: dump a config with
OmegaConf.to_yaml or OmegaConf.to_container(..., enum_to_str=True), and store `str(member)` (or
`plain(value)`) in state dicts.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Any


class ConfigEnum(str, Enum):
    """A config field with a fixed set of values: OmegaConf rejects any other at composition.

    The str mixin plus __str__ / __format__ / __repr__ returning the value make a member behave
    as its string in comparisons (`impl == "auto"`), dict lookups, f-strings, messages and
    json.dumps. OmegaConf converts strings to members by name, so each member's name is its value.
    """

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __repr__(self) -> str:
        return repr(self.value)


def config_enum(name: str, values: Iterable[str], module: str) -> Any:
    """A ConfigEnum subclass whose members are `values`, each named by its value (any string:
    "1f1b", "serve-bench"). `module` is the defining module's __name__ (pickling finds the class
    there by `name`, so assign the result to a module-level variable of that name)."""
    return ConfigEnum(name, [(value, value) for value in values], module=module, qualname=name)


def check_choice(key: str, value: Any, choices: Iterable[Any]) -> None:
    """ValueError naming the key, its value and the valid choices unless value is one of them (a dict given to
    dsrecipes.initialize, or a value computed from others, skips the Enum's own check at composition)."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def enum_values(enum_cls: type[Enum]) -> tuple[str, ...]:
    """The plain string values of an Enum, in definition order (the `*_CHOICES` tuples)."""
    return tuple(member.value for member in enum_cls)


def plain(value: Any) -> Any:
    """An Enum member's plain value; anything else unchanged (for state dicts and dumps)."""
    return value.value if isinstance(value, Enum) else value


__all__ = ["ConfigEnum", "config_enum", "enum_values", "plain"]
