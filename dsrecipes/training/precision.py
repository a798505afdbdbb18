"""Forward/backward precision: fp32, bf16 or fp16, by autocast or with fp32 master weights.

`Precision` is built from the `precision` group before anything wraps parameters and owns what the
engine needs to know: the compute dtype, whether to autocast the forward, and the fp16 loss scaler
(None for fp32/bf16). Where the fp32 master weights of a bf16/fp16 model live is the data-parallel
strategy's business (beside the module, or its sharded fp32 parameters): it reads
`compute_dtype` and `master_weights` from here.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from dsrecipes.training.config import NonfiniteGrads, PrecisionConfig, PrecisionDtype
from dsrecipes.training.loss_scaler import build_loss_scaler
from dsrecipes.utils.config_enum import enum_values
from dsrecipes.utils.dtypes import DTYPES

PRECISIONS = enum_values(PrecisionDtype)
NONFINITE_POLICIES = enum_values(NonfiniteGrads)


def warn_fp16_on_cpu(cfg: PrecisionConfig, device_name: str, device: torch.device) -> None:
    """precision.dtype=fp16 on a CPU: it runs (torch autocasts to fp16 on the CPU and the loss scaler works), but it
    is no fast path there, so the run is told what it gets. device_name: trainer.device as the recipe says it."""
    if cfg.dtype == "fp16" and device.type == "cpu":
        warnings.warn(
            f"precision.dtype=fp16 on a CPU (trainer.device={device_name}): torch autocasts matmuls to fp16 on "
            "the CPU and the loss scaler runs as on a GPU, so training is correct, but most CPU kernels have no fast "
            "fp16 path (expect it several times slower than fp32). fp16 is for GPUs; on a CPU use precision=fp32 or bf16",
            stacklevel=4,
        )


def steps_bf16_masters(cfg) -> bool:
    """precision.master_dtype=bf16: the optimizer steps the bf16 weights themselves (no fp32 copy, bf16 state)."""
    return str(getattr(cfg, "master_dtype", "fp32")) == "bf16"


def validate_precision_config(cfg: PrecisionConfig, prefix: str = "precision") -> None:
    """ValueError naming the key, value and valid choices (DeepSpeed's fp16 validators included)."""
    if cfg.dtype not in PRECISIONS:
        raise ValueError(f"{prefix}.dtype={cfg.dtype!r} is not valid; choose one of: {', '.join(PRECISIONS)}")
    if cfg.nonfinite_grads not in NONFINITE_POLICIES:
        raise ValueError(
            f"{prefix}.nonfinite_grads={cfg.nonfinite_grads!r} is not valid; choose one of: {', '.join(NONFINITE_POLICIES)}"
        )
    if cfg.auto_cast and cfg.dtype != "fp16":
        raise ValueError(f"{prefix}.auto_cast=true casts the forward's inputs to fp16, so it needs dtype fp16 (got "
                         f"dtype={cfg.dtype}); DeepSpeed's key lives in its fp16 block")
    if cfg.master_weights and cfg.dtype == "fp32":
        raise ValueError(f"{prefix}.master_weights=true needs dtype bf16 or fp16 (got dtype=fp32)")
    if steps_bf16_masters(cfg) and (cfg.dtype != "bf16" or not cfg.master_weights):
        raise ValueError(f"{prefix}.master_dtype=bf16 (the optimizer steps the bf16 weights themselves) needs "
                         f"{prefix}.dtype=bf16 and {prefix}.master_weights=true (got dtype={cfg.dtype}, "
                         f"master_weights={str(cfg.master_weights).lower()}); choose from fp32, bf16")
    if cfg.loss_scale < 0:
        raise ValueError(f"{prefix}.loss_scale={cfg.loss_scale} must be >= 0 (0 = dynamic)")
    if cfg.dtype == "fp16" and cfg.loss_scale == 0:
        for key in ("loss_scale_window", "min_loss_scale", "hysteresis"):
            if getattr(cfg, key) <= 0:
                raise ValueError(f"{prefix}.{key}={getattr(cfg, key)} must be > 0 with dynamic loss scaling")


def fast_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether `device` computes bf16 matmuls faster than fp32, and why (for the run log)."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return True, f"{torch.cuda.get_device_name(device)} has bf16 tensor cores"
        return False, f"{torch.cuda.get_device_name(device)} has no native bf16"
    if device.type == "cpu":
        if getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
            return True, "this CPU has AMX bf16 tiles"
        return False, "this CPU has no AMX tiles (bf16 matmuls run slower than fp32)"
    return False, f"bf16 speed on {device.type} is unknown"


def resolve_auto_precision(cfg: PrecisionConfig, device: torch.device) -> str | None:
    """precision.dtype=auto -> bf16 autocast where the device is fast at bf16, else fp32 (in place).

    Returns the log line saying what auto chose and why; None when dtype was not auto. With
    master_weights=true, auto picks bf16 with fp32 masters, or plain fp32 (master weights off).
    """
    if cfg.dtype != "auto":
        return None
    fast, why = fast_bf16(device)
    cfg.dtype = PrecisionDtype("bf16" if fast else "fp32")
    if not fast:
        cfg.master_weights = False
    return f"precision.dtype=auto -> {cfg.dtype} on {device.type}: {why}"


class Precision:
    def __init__(self, cfg: PrecisionConfig, device: torch.device):
        resolve_auto_precision(cfg, device)
        validate_precision_config(cfg)
        self.cfg = cfg
        self.name = str(cfg.dtype)
        self.device = device
        self.compute_dtype = DTYPES[cfg.dtype]
        # autocast also with master weights: it casts fp32 inputs and keeps norms and losses in fp32
        self.use_autocast = cfg.dtype != "fp32"
        self.loss_scaler = build_loss_scaler(cfg)

    @property
    def master_weights(self) -> bool:
        """The model itself computes in bf16/fp16 and the optimizer steps fp32 masters."""
        return bool(self.cfg.master_weights) and not self.bf16_masters

    @property
    def bf16_masters(self) -> bool:
        """precision.master_dtype=bf16: the model is cast to bf16 and the optimizer steps those weights (no fp32
        copy; its state is bf16 too)."""
        return steps_bf16_masters(self.cfg)

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale if self.loss_scaler is not None else 1.0

    def autocast(self):
        """Context manager for the forward pass."""
        if not self.use_autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)
