"""`python -m dsrecipes deepspeed_config=PATH ...`: the DeepSpeed config becomes an experiment, under the overrides.

    python -m dsrecipes deepspeed_config=ds_config.json trainer.max_steps=200 optimizer.lr=3e-4

Before Hydra composes, `apply_deepspeed_argument` reads and translates the file (refusing it, one
line, if a key cannot be honoured), registers the translation in Hydra's ConfigStore as
`deepspeed_import/<file stem>` (package _global_: the options it picks as `override /optimizer:
lamb`, then its values, exactly what convert_ds_config writes as a file), and adds
`+deepspeed_import=<stem>` to the overrides right after `deepspeed_config=PATH`. Hydra then gives
the user's overrides precedence by its own rules: an option typed on the command line
(`optimizer=sgd`) beats the experiment's `override /optimizer`, and every `key=value` is applied
after the composition. The DeepSpeed block of a group the command line picks otherwise is dropped
whole (its keys would not fit the other option).

`deepspeed_config` itself stays in the recipe, as the file's absolute path: the record of where the
recipe came from, which spawned workers re-read (dsrecipes.config.loading translates it again, under
the recipe's own values, which all win). One file per run: a multirun sweep over several DeepSpeed
configs converts each with convert_ds_config and sweeps +experiment=a,b instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from dsrecipes.config.ds_import import load_translation
from dsrecipes.config.ds_import.report import print_report

GROUP = "deepspeed_import"
KEY = "deepspeed_config"
_ARGUMENT = re.compile(rf"^\+{{0,2}}{KEY}=(.*)$")
_OPTION_GROUPS = ("optimizer", "lr_scheduler")


def _option_picks(argv: list[str]) -> dict[str, str]:
    """group -> option for `optimizer=X` / `lr_scheduler=X` on the command line (the last one wins)."""
    picks = {}
    for arg in argv:
        key, sep, value = arg.lstrip("+").partition("=")
        if sep and key in _OPTION_GROUPS:
            picks[key] = value
    return picks


def _recipe_without_the_file(argv: list[str], index: int, compose: Callable) -> dict | None:
    """The recipe the file goes on (argv's overrides composed without it), whose numbers "auto" batch / clipping keys
    take; None (the schema's numbers) where argv does not compose alone (a sweep, Hydra flags)."""
    overrides = [arg for i, arg in enumerate(argv) if i != index and not arg.startswith("-")]
    try:
        from omegaconf import OmegaConf

        return OmegaConf.to_container(compose(overrides), resolve=False)
    except Exception:  # noqa: BLE001 - any composition error: fall back to the schema's numbers
        return None


def config_name(path: str) -> str:
    """The ConfigStore name of a DeepSpeed file: its stem, with characters Hydra's override grammar dislikes replaced."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", Path(path).stem) or "deepspeed"


def _register(name: str, node: dict) -> None:
    """Store the translation as `deepspeed_import/<name>`; an equal one stored before is kept, so the merges
    compose() cached on it stay valid (dsrecipes.config.compose_cache keys them by the store's nodes)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    store = ConfigStore.instance()
    stored = store.repo.get(GROUP, {}).get(f"{name}.yaml")
    if stored is not None and stored.package == "_global_" and \
            OmegaConf.to_container(stored.node) == OmegaConf.to_container(OmegaConf.create(node)):
        return
    store.store(group=GROUP, name=name, node=node, package="_global_")


def apply_deepspeed_argument(argv: list[str], compose: Callable, report: bool = True) -> list[str]:
    """argv with `+deepspeed_import=<stem>` after `deepspeed_config=PATH` (registered in the ConfigStore); argv unchanged
    without one. ValueError / FileNotFoundError for a file that cannot be read or honoured.

    compose(overrides) -> DictConfig is dsrecipes.config.store.compose, passed in (store calls this function, so an
    import of store here would run back up): "auto" keys take the numbers of the recipe composed without the file."""
    found = [(i, m.group(1)) for i, arg in enumerate(argv) if (m := _ARGUMENT.match(arg))]
    if not found:
        return argv
    if len(found) > 1:
        raise ValueError(f"{KEY} is given {len(found)} times; give one DeepSpeed config")
    index, path = found[0]
    path = path.strip("'\"")
    if path in ("null", "None", ""):
        return argv
    if "," in path:
        raise ValueError(f"{KEY}={path}: one DeepSpeed config per run; to sweep several, convert each "
                         "(python -m dsrecipes.convert_ds_config FILE > conf/experiment/NAME.yaml) and sweep "
                         "+experiment=A,B")
    translation = load_translation(path, name=path, recipe=_recipe_without_the_file(argv, index, compose))
    translation.give_way(_option_picks(argv), "the command line")
    name = config_name(path)
    _register(name, translation.experiment_node())
    if report:
        print_report(translation, path)
    # recorded as an absolute path: workers re-read it (load_config), whatever their working directory
    argv = [*argv[:index], argv[index].split("=", 1)[0] + "=" + str(Path(path).resolve()), *argv[index + 1:]]
    if any(arg.lstrip("+").startswith(f"{GROUP}=") for arg in argv):  # a re-run of a recorded overrides list
        return argv
    return [*argv[:index + 1], f"+{GROUP}={name}", *argv[index + 1:]]
