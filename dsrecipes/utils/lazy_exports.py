"""A package's public names imported on first use (PEP 562 module __getattr__).

Used by dsrecipes.data and dsrecipes.inference, whose modules pull in heavy libraries (datasets and
pandas; the inference engine), and by dsrecipes.config, .models, .profiling, .profiling.autotuning and
.compression, whose modules import torch: importing the package, or one light module of it (a config
schema), then costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """A module __getattr__ for `package` that imports `exports[name]` (a module path) when `name` is first used."""

    def __getattr__(name: str):
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
