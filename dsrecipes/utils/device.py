"""Device selection (`trainer.device`) and the peak-FLOPs table used for MFU."""

from __future__ import annotations

import os
import re

import torch

# Dense bf16 peak TFLOP/s of common accelerators, matched against torch.cuda.get_device_name().
_PEAK_BF16_TFLOPS = (("H200", 989.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0), ("A10G", 125.0), ("4090", 165.0))


def resolve_device(spec: str) -> torch.device:
    """'auto' -> cuda if available else cpu; 'cpu'; 'cuda' / 'cuda:N' (error if CUDA is absent)."""
    if spec == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", torch.cuda.current_device())))
    if spec == "cpu":
        return torch.device("cpu")
    if re.fullmatch(r"cuda(:\d+)?", spec):
        if not torch.cuda.is_available():
            raise ValueError(f"trainer.device={spec!r} but CUDA is not available; use 'auto' or 'cpu'")
        return torch.device(spec)
    raise ValueError(f"trainer.device={spec!r} is not valid; choose one of: auto, cpu, cuda, cuda:N")


def peak_tflops(device: torch.device, configured: float | None) -> float | None:
    """The configured peak, else a known GPU's bf16 peak, else None (MFU is then not logged)."""
    if configured:
        return configured
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in _PEAK_BF16_TFLOPS:
            if key in name:
                return value
    return None
