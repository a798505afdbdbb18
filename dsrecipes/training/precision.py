"""Forward/backward precision: fp32, or bf16 autocast over fp32 weights and optimizer state.

The engine enters `autocast()` around every forward; backward then runs in the dtypes autocast
chose. fp16 with DeepSpeed's dynamic loss scaler belongs to the training-engine work and plugs in
here (a scaler object the engine consults in backward/step).
"""

from __future__ import annotations

import contextlib

import torch

from dsrecipes.training.config import PrecisionConfig

PRECISIONS = ("fp32", "bf16")


class Precision:
    def __init__(self, cfg: PrecisionConfig, device: torch.device):
        if cfg.dtype not in PRECISIONS:
            raise ValueError(f"precision.dtype={cfg.dtype!r} is not valid; choose one of: {', '.join(PRECISIONS)}")
        self.name = cfg.dtype
        self.device = device
        self.compute_dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32

    def autocast(self):
        """Context manager for the forward pass."""
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)
