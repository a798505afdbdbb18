"""The one table of dtype names the configs use (precision.dtype, generate.dtype, benchmark flags).

    DTYPES["bf16"] -> torch.bfloat16
    dtype_from_name("half", key="generate.dtype") -> torch.float16 (aliases accepted, ValueError otherwise)
"""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# spellings other tools use for the same three dtypes (torch's own names, "half")
DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def dtype_from_name(name: str, key: str = "dtype") -> torch.dtype:
    """The torch dtype of a config name (fp32 / bf16 / fp16 or an alias); ValueError naming `key` otherwise."""
    canonical = DTYPE_ALIASES.get(str(name), str(name))
    if canonical not in DTYPES:
        choices = ", ".join([*DTYPES, *DTYPE_ALIASES])
        raise ValueError(f"{key}={name!r} is not valid; choose one of: {choices}")
    return DTYPES[canonical]


def dtype_name(dtype: torch.dtype) -> str:
    """The config name of a torch dtype (torch.bfloat16 -> "bf16")."""
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    return str(dtype).replace("torch.", "")
