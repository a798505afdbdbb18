"""The closest valid key for an unknown one: `trainer.max_stepz` -> "did you mean trainer.max_steps?".

Two places meet an unknown key. A `+key=value` override on a struct node is refused by the Preflight
(dsrecipes.config.override_values). A key a YAML file sets (an experiment in `--config-dir`, a group option of
one's own) fails in Hydra's composition, before any run directory exists, with OmegaConf's
`Key 'max_stepz' not in 'TrainerConfig'` and the full key, but no suggestion; Hydra prints that and exits 1.
`explain_composition_failure` runs only then, on the failure path: it composes the same command line again
through Hydra's compose API to get OmegaConf's error object, and prints the closest keys of the schema the key
missed (one line on stderr). A successful run pays nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys

# Hydra's command-line options that take the next argument as their value
OPTIONS_WITH_VALUE = frozenset({"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                                "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"})


def schema_keys(schema) -> list[str]:
    """The user-facing field names of a dataclass schema (fields starting with _ are Hydra's or internal)."""
    return [field.name for field in dataclasses.fields(schema) if not field.name.startswith("_")]


def closest_keys_hint(parent_key: str, leaf: str, names: list[str]) -> str:
    """ "did you mean trainer.max_steps? " (the closest names first), or "" when none is close."""
    closest = difflib.get_close_matches(leaf, names, n=3, cutoff=0.6)
    prefix = f"{parent_key}." if parent_key else ""
    return f"did you mean {', '.join(prefix + name for name in closest)}? " if closest else ""


def command_line_overrides(args: list[str]) -> tuple[list[str], str | None]:
    """(the overrides, the --config-dir) of a `python -m dsrecipes` command line."""
    overrides, config_dir, option = [], None, None
    for arg in args:
        if option is not None:
            config_dir = arg if option in ("--config-dir", "-cd") else config_dir
            option = None
        elif arg.startswith("--config-dir="):
            config_dir = arg.split("=", 1)[1]
        elif arg in OPTIONS_WITH_VALUE:
            option = arg
        elif not arg.startswith("-"):
            overrides.append(arg)
    return overrides, config_dir


def unknown_key_message(error: BaseException) -> str | None:
    """The hint line for a composition error whose cause is an unknown key of a dataclass schema, else None."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    cause = error.__cause__ or error.__context__
    if not isinstance(cause, (ConfigKeyError, ConfigAttributeError)) or not getattr(cause, "full_key", None):
        return None
    schema = getattr(cause, "object_type", None)
    if not dataclasses.is_dataclass(schema):
        return None
    parent_key, _, leaf = str(cause.full_key).rpartition(".")
    names = schema_keys(schema)
    if leaf in names:
        return None
    node = parent_key or "the recipe's top level"
    return (f"{cause.full_key} is not a key of {node}: {closest_keys_hint(parent_key, leaf, names)}"
            f"{node}'s keys: {', '.join(sorted(names))}")


def explain_composition_failure(args: list[str]) -> None:
    """Compose `args` again; if it fails on an unknown schema key, print the closest valid keys on stderr."""
    from dsrecipes.config.store import compose

    overrides, config_dir = command_line_overrides(args)
    if config_dir:
        overrides.append(f"hydra.searchpath=[file://{config_dir}]")
    try:
        compose(overrides)
    except Exception as error:  # noqa: BLE001 - any composition error: only an unknown key gets a hint
        message = unknown_key_message(error)
        if message:
            print(f"dsrecipes: error: {message}", file=sys.stderr, flush=True)
