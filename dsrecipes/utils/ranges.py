"""The valid range of every numeric key of a recipe: declared on the schema field, checked in one place.

Each int / float field of a config schema (and each list of numbers, entry by entry) carries the loosest
bound that holds whatever else the recipe says, next to its default: `n_layer: int = ranged(12, POSITIVE_INT)`,
`betas: list[float] = field(default_factory=..., metadata=in_range(between(0, 1, high_open=True)))`. A float
must also be finite (OmegaConf takes `nan` and `inf`). What depends on other keys (moe.k <= moe.num_experts, a
curriculum's difficulty range, the batch triple) stays with each group's checks; the range is what no recipe
may go outside of, including a group that is switched off. tests/unit/test_bad_input.py checks that every
numeric field of the schema (every option of optimizer / lr_scheduler included) declares one, so a new field
cannot skip it.

    check_ranges(root)   # ValueError: "model.norm_eps=0.0 must be > 0"
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

SEED_MAX = 2**63 - 1


@dataclass(frozen=True)
class Range:
    """low / high bounds (open or closed), or a set of choices; nullable: None is valid too (`null_means` says what it does)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple | None = None
    nullable: bool = False
    null_means: str = ""

    def contains(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.choices is not None:
            return value in self.choices
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (self.high is not None and (value > self.high or (self.high_open and value == self.high)))

    def describe(self, with_null: bool = True) -> str:
        if self.choices is not None:
            text = f"one of: {', '.join(map(str, self.choices))}"
        elif self.low is not None and self.high is not None:
            text = f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {_num(self.low)}"
        elif self.high is not None:
            text = f"{'<' if self.high_open else '<='} {_num(self.high)}"
        else:
            text = "a finite number"
        if self.nullable and with_null:
            text += f" (or null{': ' + self.null_means if self.null_means else ''})"
        return text


def _num(x: float) -> str:
    return "2**63 - 1" if x == SEED_MAX else (str(int(x)) if float(x).is_integer() else str(x))


def at_least(low: float, nullable: bool = False, null_means: str = "") -> Range:
    return Range(low=low, nullable=nullable, null_means=null_means)


def above(low: float, nullable: bool = False, null_means: str = "") -> Range:
    return Range(low=low, low_open=True, nullable=nullable, null_means=null_means)


def between(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Range:
    return Range(low=low, high=high, low_open=low_open, high_open=high_open)


POSITIVE_INT = at_least(1)
COUNT = at_least(0)  # a count or step index where 0 is meaningful
NON_NEGATIVE = at_least(0)
POSITIVE = above(0)
UNIT = between(0, 1)
SEED = Range(low=0, high=SEED_MAX)
ANY = Range()  # only finiteness: the group's validator checks the value against the other keys

_RANGE = "range"  # the field-metadata key


def in_range(rule: Range) -> dict[str, Range]:
    """Field metadata declaring a field's valid range: `field(default_factory=list, metadata=in_range(COUNT))`."""
    return {_RANGE: rule}


def ranged(default: Any, rule: Range) -> Any:
    """A dataclass field with a plain default and a valid range: `n_layer: int = ranged(12, POSITIVE_INT)`."""
    return dataclasses.field(default=default, metadata=in_range(rule))


def field_range(f: dataclasses.Field) -> Range | None:
    """The range a schema field declares (None: not a ranged field)."""
    return f.metadata.get(_RANGE)




def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, (bool, Enum))


def check_value(key: str, value: Any, rule: Range) -> None:
    """ValueError naming key, value and the valid range unless value (a number, a list of numbers or None) fits rule."""
    if value is None:
        if not rule.nullable:
            raise ValueError(f"{key}=null is not valid; it must be {rule.describe()}")
        return
    if isinstance(value, (list, tuple)):
        for index, entry in enumerate(value):
            if _is_number(entry) and not rule.contains(entry):
                raise ValueError(f"{key}={list(value)} is not valid: entry {index} is {entry}; every entry must be "
                                 f"{rule.describe(with_null=False)}")
        return
    if _is_number(value) and not rule.contains(value):
        if rule.choices is not None:
            raise ValueError(f"{key}={value} is not valid; choose {rule.describe()}")
        raise ValueError(f"{key}={value} must be {rule.describe()}")


def _walk(obj: Any, prefix: str):
    """(key, value, declared range or None) of every field of a config dataclass object, nested sections flattened."""
    for f in dataclasses.fields(obj):
        if f.metadata.get("omegaconf_ignore"):
            continue
        value = getattr(obj, f.name)
        key = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _walk(value, key)
        else:
            yield key, value, field_range(f)


def check_ranges(root: Any) -> None:
    """ValueError for the first numeric key of root (a RootConfig) outside the range its field declares."""
    check_section(root, "")


def check_section(section: Any, prefix: str) -> None:
    """The declared ranges of one section object (a ModelConfig, a GenerateConfig ...), its keys named `prefix`.*"""
    for key, value, rule in _walk(section, prefix):
        if rule is not None:
            check_value(key, value, rule)


def _numeric(tp: Any) -> bool:
    """int / float (optionally None or a list of them): the field types RANGES must cover."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (list, tuple):
        return bool(args) and all(_numeric(a) for a in args)
    if args and typing.get_origin(tp) is not None:  # X | None, or int | str (a number or a name such as "node")
        numbers = [a for a in args if a is not str]
        return bool(numbers) and all(_numeric(a) for a in numbers)
    return tp in (int, float)


def _schema_fields(schema: type, option_schemas: dict | None = None, prefix: str = ""):
    """(key, field, type) of every leaf field of a config schema, nested sections flattened; a group in
    option_schemas ({group: {option: schema}}, e.g. dsrecipes.training.config.OPTION_SCHEMAS) over all its options."""
    option_schemas = option_schemas or {}
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if f.metadata.get("omegaconf_ignore"):
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        if not prefix and f.name in option_schemas:
            for option in option_schemas[f.name].values():
                yield from _schema_fields(option, prefix=key)
        elif dataclasses.is_dataclass(tp):
            yield from _schema_fields(tp, prefix=key)
        else:
            yield key, f, tp


def schema_ranges(schema: type, option_schemas: dict | None = None) -> dict[str, Range]:
    """{key: range} of every ranged field of a config schema (a group in option_schemas: over all its options)."""
    return {key: field_range(f) for key, f, _ in _schema_fields(schema, option_schemas) if field_range(f) is not None}


def numeric_keys(schema: type, option_schemas: dict | None = None) -> set[str]:
    """Every numeric key of a config schema; a group in option_schemas counts the union over its options' schemas."""
    return {key for key, _, tp in _schema_fields(schema, option_schemas) if _numeric(tp)}
