"""The result of reading a DeepSpeed config: dsrecipes values, group options, and every key's fate.

A `Translation` is filled by the block readers (dsrecipes.config.ds_import.*) and then handed out
in the three forms the entry points need:

* `as_config()`: a nested dict for `load_config` / `dsrecipes.initialize` (the option of the
  optimizer / lr_scheduler group as its `name` key);
* `experiment_node()`: a Hydra config with a defaults list (`override /optimizer: lamb`), what the
  CLI registers for `deepspeed_config=PATH`;
* `experiment_yaml()`: the same as a `# @package _global_` experiment file (convert_ds_config).

Each key of the DeepSpeed config gets one `Fate`: mapped (to a dsrecipes key), auto (resolved as
Hugging Face's integration resolves it), default (a key the block leaves out, set to DeepSpeed's
default), ignored (accepted, no effect here, and why) or refused (why). Refused keys make
`raise_if_refused` raise one ValueError naming all of them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAPPED = "mapped"
AUTO = "auto"
DEFAULT = "default"
IGNORED = "no effect"
REFUSED = "refused"
KINDS = (MAPPED, AUTO, DEFAULT, IGNORED, REFUSED)


def shown(value: Any) -> str:
    """A value as the report and error messages show it (JSON-like, short)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, dict):
        return "{...}" if value else "{}"
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        text = "[" + ", ".join(shown(v) for v in value) + "]"
        return text if len(text) <= 40 else text[:37] + "...]"
    return repr(value)


@dataclass(frozen=True)
class Fate:
    """What became of one DeepSpeed key: `key` dotted (zero_optimization.stage), `detail` the target or the reason."""

    key: str
    value: Any
    kind: str
    detail: str


@dataclass
class Translation:
    """dsrecipes values and group options read from a DeepSpeed config, and every key's fate."""

    values: dict[str, Any] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)  # group -> option (optimizer, lr_scheduler)
    fates: list[Fate] = field(default_factory=list)
    # dsrecipes key -> (DeepSpeed key, how HF fills it): "auto" keys resolved to numbers once every block is read
    pending_autos: dict[str, tuple[str, str]] = field(default_factory=dict)

    # ------------------------------------------------------------------ filling in

    def set(self, target: str, value: Any) -> None:
        """Set the dsrecipes key `target` (dotted) to `value`."""
        *parents, last = target.split(".")
        node = self.values
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    def get(self, target: str, default: Any = None) -> Any:
        node: Any = self.values
        for part in target.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def choose(self, group: str, option: str) -> None:
        """Pick `option` of an option group (its schema, and under the CLI its conf/<group>/<option>.yaml)."""
        self.choices[group] = option

    def record(self, key: str, value: Any, kind: str, detail: str) -> None:
        assert kind in KINDS, kind
        self.fates.append(Fate(key, value, kind, detail))

    def mapped(self, key: str, value: Any, target: str, converted: Any = None, note: str = "") -> None:
        """`key` maps onto `target`, set to `converted` (the value itself when None)."""
        result = value if converted is None else converted
        self.set(target, result)
        self.record(key, value, MAPPED, f"{target}={shown(result)}" + (f" ({note})" if note else ""))

    def auto(self, key: str, detail: str, target: str | None = None, value: Any = None) -> None:
        """"auto": `detail` says what it resolves to; with a `target`, that key is set to `value`."""
        if target is not None:
            self.set(target, value)
        self.record(key, "auto", AUTO, detail)

    def auto_pending(self, key: str, target: str, how: str = "") -> None:
        """"auto" for `target`: its number is the schema's, filled in when every block is read (ds_import.absent)."""
        self.pending_autos[target] = (key, how)
        self.record(key, "auto", AUTO, f"{target}=?")

    def resolve_auto(self, key: str, detail: str) -> None:
        self.fates = [Fate(f.key, f.value, f.kind, detail) if f.key == key and f.kind == AUTO else f
                      for f in self.fates]

    def default(self, key: str, target: str, value: Any, note: str = "", deepspeed_value: Any = None) -> None:
        """A key the block leaves out: `target` gets `value`, DeepSpeed's default (`deepspeed_value` in its spelling)."""
        self.set(target, value)
        shown_value = value if deepspeed_value is None else deepspeed_value
        self.record(key, shown_value, DEFAULT,
                    f"{target}={shown(value)} (DeepSpeed's default" + (f"; {note})" if note else ")"))

    def ignored(self, key: str, value: Any, why: str) -> None:
        self.record(key, value, IGNORED, why)

    def refused(self, key: str, value: Any, why: str) -> None:
        self.record(key, value, REFUSED, why)

    # ------------------------------------------------------------------ reading out

    @property
    def refusals(self) -> list[Fate]:
        return [f for f in self.fates if f.kind == REFUSED]

    def counts(self) -> dict[str, int]:
        return {kind: sum(f.kind == kind for f in self.fates) for kind in KINDS}

    def fate(self, key: str) -> Fate | None:
        return next((f for f in self.fates if f.key == key), None)

    def raise_if_refused(self, source: str = "DeepSpeed config") -> None:
        """One ValueError naming every refused key, its value and why, before any work starts."""
        refused = self.refusals
        if refused:
            keys = "; ".join(f"{f.key}={shown(f.value)}: {f.detail}" for f in refused)
            raise ValueError(f"{source}: {len(refused)} key(s) dsrecipes cannot honour: {keys}")

    def give_way(self, picks: Mapping[str, Any], where: str) -> None:
        """Drop the option and values of every group for which `picks` names another option (`optimizer=sgd`).

        picks: group -> the option the user chose (`where` says where: "the command line"). The
        user's choice wins anyway (for the CLI it is Hydra's rule for overrides of the defaults
        list); dropping the DeepSpeed block's values too keeps them off an option that does not
        take them (`betas` on SGD). Their fates say so.
        """
        for group, option in picks.items():
            if group not in self.choices or self.choices[group] == option:
                continue
            del self.choices[group]
            self.values.pop(group, None)
            why = f"{where} picks {group}={option}, which replaces the DeepSpeed block"
            self.fates = [Fate(f.key, f.value, IGNORED, why) if f.detail.startswith((f"{group}.", f"{group}=")) else f
                          for f in self.fates]

    def as_config(self) -> dict[str, Any]:
        """The values as a dsrecipes config dict (for load_config), each chosen option as its group's `name`."""
        config = copy.deepcopy(self.values)
        for group, option in self.choices.items():
            config.setdefault(group, {})["name"] = option
        return config

    def experiment_node(self) -> dict[str, Any]:
        """A Hydra config (package _global_) that picks the options and sets the values."""
        defaults: list[Any] = [{f"override /{group}": option} for group, option in self.choices.items()]
        return {"defaults": [*defaults, "_self_"], **copy.deepcopy(self.values)}

    def experiment_yaml(self, source: str, command: str) -> str:
        """The equivalent experiment file: `# @package _global_`, a comment naming `source`, the defaults, the values."""
        from omegaconf import OmegaConf

        head = [
            "# @package _global_",
            f"# Translated from the DeepSpeed config {source} by dsrecipes.convert_ds_config: {command}",
        ]
        if self.choices:
            head += ["defaults:"] + [f"  - override /{group}: {option}" for group, option in self.choices.items()]
        body = OmegaConf.to_yaml(OmegaConf.create(self.values)) if self.values else ""
        return "\n".join(head) + "\n\n" + body
