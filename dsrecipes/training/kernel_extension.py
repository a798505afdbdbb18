"""Kernel injection as a Trainer extension: applies the recipe's `kernels.backend` to every model.

Registered at import (dsrecipes.training.trainer imports this module), so every Trainer built from a
recipe swaps in dsrecipes.kernels' fused ops when kernels.backend is triton (or auto on a CUDA
device), right after the model is built and before the engine wraps it.
"""

from __future__ import annotations

import logging

from torch import nn

from dsrecipes.models.kernel_injection import inject_kernels
from dsrecipes.training.extensions import Extensions, register_extension

log = logging.getLogger("dsrecipes")


@register_extension
def kernel_injection_extension(cfg) -> Extensions:
    """Extensions with one model transform: inject_kernels(model, cfg.kernels.backend) (auto resolved per device)."""
    kernels_cfg = getattr(cfg, "kernels", None)
    backend = getattr(kernels_cfg, "backend", "auto") if kernels_cfg is not None else "auto"

    def transform(model: nn.Module) -> nn.Module:
        lines = inject_kernels(model, backend)
        if lines:
            log.info("kernels: backend=%s -> triton", backend)
        for line in lines:
            log.info("kernels: %s", line)
        return model

    return Extensions(model_transforms=[transform])
