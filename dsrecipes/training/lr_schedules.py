"""Learning-rate schedules with DeepSpeed's formulas, stepped once per applied optimizer step.

`t` is the 0-based index of the optimizer step the lr is used for (DeepSpeed's
last_batch_iteration after the scheduler's first step). Built on torch's LambdaLR so the state dict,
get_last_lr() and optimizer integration are torch's own.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from dsrecipes.training.config import LRSchedulerConfig

LR_SCHEDULERS = ("warmup_cosine", "constant")
WARMUP_TYPES = ("linear", "log")


def warmup_gamma(t: int, warmup_num_steps: int, warmup_type: str) -> float:
    """Warmup progress in [0, 1]: log(t+1)/log(N) or t/N for t < N, else 1 (N >= 2 as in DeepSpeed)."""
    n = max(2, warmup_num_steps)
    if t >= n:
        return 1.0
    if warmup_type == "log":
        return math.log(t + 1) / math.log(n)
    return t / n


def warmup_cosine_ratio(
    t: int, *, total_num_steps: int, warmup_num_steps: int, warmup_min_ratio: float, cos_min_ratio: float,
    warmup_type: str,
) -> float:
    """DeepSpeed WarmupCosineLR: the multiplier of the optimizer's base lr at step t."""
    if t < warmup_num_steps:
        gamma = warmup_gamma(t, warmup_num_steps, warmup_type)
        return warmup_min_ratio + (1.0 - warmup_min_ratio) * gamma
    progress = min(1.0, (t - warmup_num_steps + 1) / max(1, total_num_steps - warmup_num_steps))
    return max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _constant_ratio(t: int) -> float:
    return 1.0


def build_lr_scheduler(
    cfg: LRSchedulerConfig, optimizer: torch.optim.Optimizer, max_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """The configured schedule for `optimizer`; total_num_steps defaults to the run's max_steps."""
    if cfg.name == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, _constant_ratio)
    if cfg.name == "warmup_cosine":
        ratio = partial(
            warmup_cosine_ratio,
            total_num_steps=cfg.total_num_steps or max_steps,
            warmup_num_steps=cfg.warmup_num_steps,
            warmup_min_ratio=cfg.warmup_min_ratio,
            cos_min_ratio=cfg.cos_min_ratio,
            warmup_type=cfg.warmup_type,
        )
        return torch.optim.lr_scheduler.LambdaLR(optimizer, ratio)
    raise ValueError(f"lr_scheduler.name={cfg.name!r} is not valid; choose one of: {', '.join(LR_SCHEDULERS)}")
