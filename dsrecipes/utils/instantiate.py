"""Objects from config nodes: hydra.utils.instantiate behind one function.

What: `instantiate(node, key)` builds `node["_target_"]` (a class or function by import path) with
the node's other keys as keyword arguments, Hydra's flat convention; with `_partial_: true` it
returns a functools.partial to be called with the runtime objects (parameters, an optimizer) at
the call site, which never live in config.

Why Hydra, and why only here: hydra.utils.instantiate is a pure function of the node it is given.
It reads no Hydra global state (no GlobalHydra, no HydraConfig, no initialize()), so it works the
same in the CLI, in `dsrecipes.initialize`, in spawned workers and in tests, and it brings Hydra's
`_target_` / `_partial_` / nested-instantiation semantics and its target policy with it. Keeping
the call in this one module (the only one below dsrecipes/config and the CLI that imports Hydra)
gives every caller the same conversion rules and the same errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate as _hydra_instantiate

__all__ = ["instantiate"]

_UNSET = (None, "", "???")  # "???" is OmegaConf's MISSING


def instantiate(node: Mapping[str, Any], key: str, *args: Any, **kwargs: Any) -> Any:
    """`node["_target_"]` built from the node's other keys; a partial when `node["_partial_"]` is true.

    key names the node in the recipe (e.g. "optimizer") for messages. args / kwargs are passed
    to the target after the node's keys are bound (ignored for a partial: call it with them).
    Lists and dicts reach the target as plain Python containers (`_convert_="all"`), never
    DictConfig, so what it builds pickles and loads with torch.load(weights_only=True).

    Raises ValueError naming `<key>._target_` and its value when the target is unset or cannot
    be imported (or Hydra's target policy refuses it), and naming `key` when building fails.
    """
    target = node.get("_target_")
    _locate(target, key)
    try:
        built = _hydra_instantiate({**node, "_partial_": True}, _convert_="all")
    except InstantiationException as err:
        raise ValueError(f"{key}: cannot build _target_={target!r}: {err}") from err
    return built if node.get("_partial_") else built(*args, **kwargs)


def _locate(target: Any, key: str) -> None:
    """ValueError unless `target` is an import path Hydra resolves to a callable (nothing is called)."""
    if target in _UNSET or not isinstance(target, str):
        raise ValueError(f"{key}._target_={target!r} must be set to a class or function by import path "
                         "(e.g. torch.optim.AdamW)")
    try:
        _hydra_instantiate({"_target_": target, "_partial_": True})
    except InstantiationException as err:
        reason = str(err.__cause__ or err).strip().replace("\n", " ")
        raise ValueError(f"{key}._target_={target!r} cannot be imported: {reason}") from err
