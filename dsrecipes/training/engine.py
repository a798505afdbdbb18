"""The Engine: one object owning model, optimizer, LR schedule and precision, with DeepSpeed's API.

    out = engine(input_ids, labels=labels)   # forward under the configured precision
    engine.backward(out.loss)                 # loss / gradient_accumulation_steps, then backward
    engine.step()                             # optimizer step only at the accumulation boundary

Semantics follow DeepSpeed's engine: `backward` divides the loss by the accumulation steps (do not
divide again), `step` is called after every micro-batch and only the boundary call clips (global
norm), steps the optimizer and the LR schedule and zeroes gradients; `global_steps` counts optimizer
steps and `global_samples` the samples they consumed. Both the recipe Trainer and library users
(`dsrecipes.initialize`) drive this same class, so later features (ZeRO sharding, fp16 loss scaling,
kernels) live here once.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from torch import nn

from dsrecipes.training.batch import BatchSizes
from dsrecipes.training.checkpoint import (
    prune_checkpoints,
    read_checkpoint,
    resolve_checkpoint_dir,
    write_checkpoint,
)
from dsrecipes.training.precision import Precision
from dsrecipes.utils.seed import rng_state, set_rng_state


class Engine:
    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        batch: BatchSizes,
        precision: Precision,
        gradient_clipping: float = 1.0,
        keep_last_checkpoints: int = 0,
        config_yaml: str | None = None,
    ):
        self.module = module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.batch = batch
        self.precision = precision
        self.gradient_clipping = gradient_clipping
        self.keep_last_checkpoints = keep_last_checkpoints
        self.config_yaml = config_yaml
        self.device = precision.device
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.last_grad_norm: float | None = None

    # ------------------------------------------------------------------ batch arithmetic
    @property
    def train_batch_size(self) -> int:
        return self.batch.train_batch_size

    @property
    def train_micro_batch_size_per_gpu(self) -> int:
        return self.batch.micro_batch_size

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.batch.gradient_accumulation_steps

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.gradient_accumulation_steps == 0

    # ------------------------------------------------------------------ training
    def __call__(self, *args, **kwargs):
        with self.precision.autocast():
            return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> "Engine":
        self.module.train(mode)
        return self

    def eval(self) -> "Engine":
        return self.train(False)

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = True) -> None:
        """Backward of loss / gradient_accumulation_steps (the window's loss is averaged exactly once)."""
        if scale_wrt_gas and self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        loss.backward()

    def step(self) -> None:
        """Call after every micro-batch; at the accumulation boundary clip, step, schedule and zero."""
        if self.is_gradient_accumulation_boundary():
            params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
            max_norm = self.gradient_clipping if self.gradient_clipping > 0 else math.inf
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else torch.tensor(0.0)
            self.last_grad_norm = float(norm)
            self.optimizer.step()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.global_steps += 1
            self.global_samples += self.train_batch_size
        self.micro_steps += 1

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, save_dir: str | os.PathLike, tag: str | None = None, client_state: dict | None = None) -> Path:
        """Atomically write <save_dir>/<tag>/ (tag defaults to step_<global_steps>) and update `latest`."""
        tag = tag or f"step_{self.global_steps}"
        engine_state = {
            "global_steps": self.global_steps,
            "global_samples": self.global_samples,
            "micro_steps": self.micro_steps,
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            "rng": rng_state(),
            "client_state": client_state or {},
        }
        files = {"model.pt": self.module.state_dict(), "optimizer.pt": self.optimizer.state_dict(), "engine.pt": engine_state}
        path = write_checkpoint(save_dir, tag, files, self.config_yaml)
        prune_checkpoints(save_dir, self.keep_last_checkpoints)
        return path

    def load_checkpoint(
        self, load_dir: str | os.PathLike, tag: str | None = None, load_optimizer_states: bool = True
    ) -> tuple[Path, dict]:
        """Restore from <load_dir>/<tag> (default: `latest`); returns (path, client_state)."""
        path = resolve_checkpoint_dir(load_dir, tag)
        self.module.load_state_dict(read_checkpoint(path, "model.pt", map_location=self.device))
        state = read_checkpoint(path, "engine.pt")
        if load_optimizer_states:
            self.optimizer.load_state_dict(read_checkpoint(path, "optimizer.pt", map_location=self.device))
            if self.lr_scheduler is not None and state["lr_scheduler"] is not None:
                self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.global_steps = state["global_steps"]
        self.global_samples = state["global_samples"]
        self.micro_steps = state["micro_steps"]
        set_rng_state(state["rng"])
        return path, state["client_state"]
