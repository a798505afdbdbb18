"""Reading a DeepSpeed config file as DeepSpeed does: JSON with duplicate keys refused (HJSON when `hjson` is installed).

DeepSpeed parses its config with hjson (a JSON superset: comments, unquoted keys) and refuses a
key given twice ("Duplicate keys in DeepSpeed config"), where json.load would keep the last one
silently. Plain JSON is read with the standard library; a file that is not JSON is read with hjson
if it is installed (DeepSpeed depends on it), else the JSON error is reported.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r} in the DeepSpeed config (DeepSpeed refuses it too)")
        seen[key] = value
    return seen


def read_deepspeed_file(path: str | os.PathLike) -> dict[str, Any]:
    """The config dict in `path`; FileNotFoundError if there is none, ValueError naming the file if it cannot be parsed."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"DeepSpeed config {path} does not exist")
    text = path.read_text()
    try:
        config = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as error:
        try:
            import hjson
        except ImportError:
            raise ValueError(f"DeepSpeed config {path} is not valid JSON: {error}") from None
        try:
            config = hjson.loads(text, object_pairs_hook=_no_duplicates)
        except hjson.HjsonDecodeError as herror:
            raise ValueError(f"DeepSpeed config {path} is neither JSON nor HJSON: {herror}") from None
    if not isinstance(config, dict):
        raise ValueError(f"DeepSpeed config {path} holds a {type(config).__name__}, not a JSON object")
    return config


def is_deepspeed_path(path: str | os.PathLike) -> bool:
    """A config path `load_config` reads as a DeepSpeed config: .json / .hjson (YAML files are dsrecipes configs)."""
    return Path(path).suffix.lower() in (".json", ".hjson")
