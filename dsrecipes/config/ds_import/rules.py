"""The rule types of the DeepSpeed key tables, and `apply_table`, which reads one block with a table.

A table maps each key DeepSpeed reads in a block to what dsrecipes does with it:

    To(target, ...)        mapped onto a dsrecipes key (converted, with DeepSpeed's default when absent)
    NoEffect(why)          accepted; nothing here depends on it (a speed or memory knob, a log option)
    RefuseUnless(why, ok)  refused (ignoring it would change the training) unless the value is harmless
    refused_when_on(...)   a block refused when its switch key is true; its other keys have no effect
    Sub(table, what)       a nested block read with its own table
    Custom(fn)             anything else: fn(translation, key, value)
    Handled()              read together with other keys by a block reader (precision, batch triple)

A key a nested table does not list is refused: DeepSpeed's pydantic blocks reject unknown keys. At the
top level DeepSpeed ignores a key it does not read, and so does dsrecipes, with a report line naming a
close DeepSpeed key if there is one (ds_import.translate).

"auto" (Hugging Face's placeholder, which DeepSpeed itself drops) is resolved where the rule says:
To writes the number its schema gives the dsrecipes key (ds_import.absent: resolved once every block
is read), or `auto` where Hugging Face fills a fixed value (warmup_min_lr's 0); NoEffect
and RefuseUnless treat it as DeepSpeed's default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dsrecipes.config.ds_import.translation import Translation, shown

ABSENT = object()  # a rule with no DeepSpeed default to fill in
RECIPE = object()  # "auto" takes the number the schema gives the target (resolved in ds_import.absent)


class Rule:
    def apply(self, t: Translation, key: str, value: Any) -> None:
        raise NotImplementedError

    def absent(self, t: Translation, key: str) -> None:
        """The block is present but leaves this key out."""


@dataclass(frozen=True)
class To(Rule):
    """Mapped onto `target`; `convert` turns DeepSpeed's value into dsrecipes' (ValueError -> refused).

    default: DeepSpeed's value (in DeepSpeed's spelling) when the block is present and the key is not
    (written, converted, so the block means what it means in DeepSpeed). auto: what "auto" becomes
    (RECIPE: the number the schema gives the target); auto_why: how Hugging Face's integration fills it, for the report.
    """

    target: str
    convert: Callable[[Any], Any] | None = None
    default: Any = ABSENT
    auto: Any = RECIPE
    auto_why: str = ""
    note: str = ""

    def apply(self, t: Translation, key: str, value: Any) -> None:
        if value == "auto":
            how = f" (Hugging Face: {self.auto_why})" if self.auto_why else ""
            if self.auto is RECIPE:
                t.auto_pending(key, self.target, f"Hugging Face: {self.auto_why}" if self.auto_why else "")
            else:
                t.auto(key, f"{self.target}={shown(self.auto)}{how}", self.target, self.auto)
            return
        try:
            converted = self.convert(value) if self.convert else value
        except ValueError as error:
            t.refused(key, value, str(error))
            return
        t.mapped(key, value, self.target, converted, self.note)

    def absent(self, t: Translation, key: str) -> None:
        if self.default is not ABSENT:
            converted = self.convert(self.default) if self.convert else self.default
            t.default(key, self.target, converted, deepspeed_value=self.default)


@dataclass(frozen=True)
class NoEffect(Rule):
    why: str

    def apply(self, t: Translation, key: str, value: Any) -> None:
        t.ignored(key, value, self.why)


@dataclass(frozen=True)
class RefuseUnless(Rule):
    """Refused with `why`, unless the value is one of `ok` (DeepSpeed's default, or what dsrecipes does anyway)."""

    why: str
    ok: tuple = (False, None)
    ok_why: str = "DeepSpeed's default: nothing to do"

    def apply(self, t: Translation, key: str, value: Any) -> None:
        if value == "auto" or any(value == ok and type(value) is type(ok) for ok in self.ok):
            t.ignored(key, value, self.ok_why)
        else:
            t.refused(key, value, self.why)


@dataclass(frozen=True)
class Sub(Rule):
    """A nested block (a dict; null means absent) read with its own table."""

    table: Mapping[str, Rule]
    what: str

    def apply(self, t: Translation, key: str, value: Any) -> None:
        if value is None:
            t.ignored(key, value, "null: DeepSpeed's default")
            return
        if not isinstance(value, Mapping):
            t.refused(key, value, f"DeepSpeed's {self.what} is a block (a JSON object), not {type(value).__name__}")
            return
        apply_table(t, key, value, self.table, self.what)


@dataclass(frozen=True)
class Custom(Rule):
    """fn(translation, key, value) reads the key; `kind` says, for the key catalog, what it does with it."""

    fn: Callable[[Translation, str, Any], None]
    kind: str = "mapped"

    def apply(self, t: Translation, key: str, value: Any) -> None:
        self.fn(t, key, value)


def refused_when_on(why: str, rest_why: str, switch: str = "enabled") -> Custom:
    """A block whose `switch: true` is refused with `why`; every other key of it (the switch when off
    included) has no effect, for `rest_why`. A value that is not a block has no effect either."""

    def read(t: Translation, key: str, value: Any) -> None:
        if not isinstance(value, Mapping):
            t.ignored(key, value, "not a block")
            return
        for name, v in value.items():
            if name == switch and v is True:
                t.refused(f"{key}.{name}", v, why)
            else:
                t.ignored(f"{key}.{name}", v, rest_why)

    return Custom(read, kind="refused")


@dataclass(frozen=True)
class Handled(Rule):
    """Read by a block reader that needs several keys at once (its fates are recorded there)."""

    def apply(self, t: Translation, key: str, value: Any) -> None:
        pass


def apply_table(t: Translation, prefix: str, block: Mapping[str, Any], table: Mapping[str, Rule], what: str) -> None:
    """Read every key of `block` (at `prefix`) with `table`; then fill DeepSpeed's defaults of the keys it leaves out."""
    for key, value in block.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        rule = table.get(key)
        if rule is None:
            t.refused(path, value, f"not a key of DeepSpeed's {what} (valid: {', '.join(table)})")
        else:
            rule.apply(t, path, value)
    for key, rule in table.items():
        if key not in block:
            rule.absent(t, f"{prefix}.{key}" if prefix else key)


def one_of(name: str, mapping: Mapping[Any, Any]) -> Callable[[Any], Any]:
    """A convert function mapping DeepSpeed's values onto dsrecipes' (ValueError naming the valid ones)."""

    def convert(value: Any) -> Any:
        if value not in mapping:
            raise ValueError(f"{name} must be one of {', '.join(map(shown, mapping))} in dsrecipes")
        return mapping[value]

    return convert


def positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError("must be a positive integer")
    return value
