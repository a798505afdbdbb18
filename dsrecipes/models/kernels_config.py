"""The `kernels` config group: which implementation the model's hot ops run on.

    kernels.backend: auto   # on CUDA (triton importable): per op, what the measured policy marks faster
                            # (dsrecipes/models/kernel_policy.json, see kernel_policy.py); elsewhere torch
    kernels.backend: torch  # the plain-torch modules (SDPA, torch norms, F.cross_entropy)
    kernels.backend: triton # dsrecipes.kernels' fused ops, swapped in by dsrecipes.models.kernel_injection

Kept free of dsrecipes.kernels imports: the kernel modules must be imported only after
TRITON_INTERPRET is settled (Triton reads it when a kernel is decorated).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsrecipes.utils.config_enum import ConfigEnum, enum_values
from dsrecipes.utils.recipe_facts import RecipeFacts

if TYPE_CHECKING:
    import torch


class KernelBackend(ConfigEnum):
    """kernels.backend (a bad value fails at composition; plain strings are checked by validate_kernels_config)."""

    auto = "auto"
    torch = "torch"
    triton = "triton"


KERNEL_BACKENDS = enum_values(KernelBackend)


@dataclass
class KernelsConfig:
    # torch (the default until the injected path is measured on a GPU) | triton | auto
    backend: KernelBackend = KernelBackend.torch

    def check(self, facts: RecipeFacts) -> None:
        """The group's own checks (dsrecipes.config.validate walks the groups)."""
        validate_kernels_config(self)


def validate_kernels_config(cfg: KernelsConfig) -> None:
    """ValueError naming kernels.backend, its value and the choices when the backend is unknown."""
    if cfg.backend not in KERNEL_BACKENDS:
        raise ValueError(f"kernels.backend={cfg.backend!r} is not valid; choose one of: {', '.join(KERNEL_BACKENDS)}")


def resolve_kernels_backend(backend: str, device: torch.device | str | None = None) -> str:
    """"torch" or "triton": whether `backend` may inject any Triton op on `device`. auto = "triton" when the model's
    device (else: any CUDA device) is CUDA and triton imports; *which* ops it then injects is the per-op
    policy's choice (dsrecipes.models.kernel_policy.choose_ops)."""
    validate_kernels_config(KernelsConfig(backend=backend))
    if backend != "auto":
        return str(backend)
    import torch  # imported here: the recipe schema imports this module, and `--help` must not import torch

    on_cuda = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if not on_cuda:
        return "torch"
    from dsrecipes.kernels._utils import triton_available  # _utils defines no kernels: safe to import early

    return "triton" if triton_available() else "torch"
