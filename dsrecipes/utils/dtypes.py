"""The one table of dtype names the configs use (precision.dtype, generate.dtype, benchmark flags).

    DTYPES["bf16"] -> torch.bfloat16
    dtype_from_name("half", key="generate.dtype") -> torch.float16 (aliases accepted, ValueError otherwise)

The names (DTYPE_NAMES, DTYPE_ALIASES) import no torch: the config schemas build their Enums from them, and
composing a recipe (`python -m dsrecipes --help`) must not import torch. DTYPES, the torch dtype of each name,
is built on first use (a PEP 562 module __getattr__), when torch is imported.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("fp32", "bf16", "fp16")
# spellings other tools use for the same three dtypes (torch's own names, "half")
DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


@functools.cache
def _dtypes() -> dict[str, torch.dtype]:
    """DTYPES: built once, so every `from dsrecipes.utils.dtypes import DTYPES` gets the same dict."""
    import torch

    return dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16)))


def __getattr__(name: str):
    if name == "DTYPES":
        return _dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dtype_from_name(name: str, key: str = "dtype") -> torch.dtype:
    """The torch dtype of a config name (fp32 / bf16 / fp16 or an alias); ValueError naming `key` otherwise."""
    canonical = DTYPE_ALIASES.get(str(name), str(name))
    if canonical not in DTYPE_NAMES:
        choices = ", ".join([*DTYPE_NAMES, *DTYPE_ALIASES])
        raise ValueError(f"{key}={name!r} is not valid; choose one of: {choices}")
    return _dtypes()[canonical]


def dtype_name(dtype: torch.dtype) -> str:
    """The config name of a torch dtype (torch.bfloat16 -> "bf16")."""
    for name, value in _dtypes().items():
        if value == dtype:
            return name
    return str(dtype).replace("torch.", "")
