"""What the optimizer and lr_scheduler groups share: one schema per option, and `custom` options whose extra keys
are the chosen class's own arguments (ExtraArguments); config_items / extra_keys read an option's keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


class ExtraArguments:
    """Mixin of the `custom` options: keys beyond the schema's fields are the class's own arguments.

    Their node accepts any key (flat, Hydra's convention); OmegaConf.to_object sets such keys as
    attributes, which land in the `extra_arguments` field. That field is hidden from OmegaConf
    (omegaconf_ignore) but is a real dataclass field, so dataclasses.replace and copy keep it.
    Reading an extra key as an attribute works too (`cfg.alpha`).
    """

    def __post_init__(self) -> None:
        # a copy: dataclasses.replace hands the original's dict to the new object
        object.__setattr__(self, "extra_arguments", dict(self.extra_arguments))

    def __setattr__(self, key: str, value: Any) -> None:
        if key in _field_names(type(self)):
            object.__setattr__(self, key, value)
        else:
            self.extra_arguments[key] = value

    def __getattr__(self, key: str) -> Any:
        extras = self.__dict__.get("extra_arguments")
        if extras is None or key.startswith("__") or key not in extras:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {key!r}")
        return extras[key]


def _field_names(cls: type) -> frozenset[str]:
    """The dataclass fields of cls (OmegaConf-hidden ones included)."""
    return frozenset(f.name for f in dataclasses.fields(cls))


def _extra_arguments_field() -> Any:
    """The hidden `extra_arguments` field of ExtraArguments schemas."""
    return field(default_factory=dict, metadata={"omegaconf_ignore": True})


def config_items(cfg: Any) -> dict[str, Any]:
    """Every key of an optimizer / lr_scheduler config object: its schema's fields, then any extra keys.

    Extra keys are the `custom` options' class arguments, or keys added to a fixed schema with
    Hydra's `+key=` (which validation rejects).
    """
    items = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "extra_arguments"}
    items.update(extra_keys(cfg))
    return items


def extra_keys(cfg: Any) -> dict[str, Any]:
    """The keys of cfg that are not fields of its schema."""
    if isinstance(cfg, ExtraArguments):
        return dict(cfg.extra_arguments)
    fields = _field_names(type(cfg))
    return {k: v for k, v in vars(cfg).items() if k not in fields}
