"""The Engine: DeepSpeed's engine API over a data-parallel strategy, a Precision and a step runner.

    out = engine(input_ids, labels=labels)   # forward under the configured precision
    engine.backward(out.loss)                 # loss x loss_scale / gradient_accumulation_steps, then backward
    engine.step()                             # the optimizer step only at the accumulation boundary
    metrics = engine.train_batch(next_batch)  # or all micro-batches of one step at once (any layout)

Semantics follow DeepSpeed's engine: `backward` divides the loss by the accumulation steps (do not
divide again), `step` is called after every micro-batch and only the boundary call clips (global
norm), steps the optimizer and the LR schedule and zeroes gradients; `global_steps` counts
optimizer steps (skipped ones included, as DeepSpeed) and `global_samples` the samples they consumed.

The Engine does not know which mechanism it drives: everything that differs between DDP, ZeRO-1/2,
FSDP2 and the rest is the strategy's (dsrecipes.distributed.data_parallel), how micro-batches are
run (one by one, or through a pipeline schedule) is the runner's (dsrecipes.training.runners), and
checkpoint files are dsrecipes.training.checkpointing.engine_checkpoint's. Built by dsrecipes.training.assembly for
both the recipe Trainer and `dsrecipes.initialize`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor.parallel import loss_parallel as tp_loss_parallel

from dsrecipes.distributed.parallelize import ParallelPlan
from dsrecipes.profiling.phases import StepPhases
from dsrecipes.training.batch import BatchSizes
from dsrecipes.training.checkpointing import engine_checkpoint
from dsrecipes.training.precision import Precision
from dsrecipes.training.runners import MicroBatchRunner, StepRunner
from dsrecipes.utils.interrupts import signals_held


class Engine:
    def __init__(
        self,
        plan: ParallelPlan,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        batch: BatchSizes,
        precision: Precision,
        runner: StepRunner | None = None,
        gradient_clipping: float = 1.0,
        keep_last_checkpoints: int = 0,
        config_yaml: str | None = None,
        rank: int = 0,
        layout: str = "",
    ):
        self.plan = plan
        self.strategy = plan.strategy
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.batch = batch
        self.precision = precision
        self.runner = runner or MicroBatchRunner()
        self.gradient_clipping = gradient_clipping
        self.keep_last_checkpoints = keep_last_checkpoints
        self.config_yaml = config_yaml
        self.layout = layout  # one line: axes, mechanism, offload, precision, kernels (dsrecipes.training.layout)
        self.device = precision.device
        self.rank = rank
        self.is_writer = rank == 0
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self.last_grad_norm: float | None = None
        self.last_step_skipped = False
        # tensor parallelism: the vocab-parallel loss's forward and backward run under torch's loss_parallel
        self._loss_context = tp_loss_parallel if plan.loss_parallel else contextlib.nullcontext
        # where each phase of a step runs, for profilers (wall-clock breakdown, flops profiler); free when unobserved
        self.phases = StepPhases()
        # called after every optimizer step that was taken (e.g. fp8's FSDP2 scale precompute, dsrecipes.distributed.float8)
        self.post_step_hooks: list[Callable[[], None]] = []

    @property
    def module(self) -> nn.Module:
        """What forward runs: the model as the strategy wrapped it (DDP, FSDP2 ...) on this rank."""
        return self.plan.module

    @property
    def masters(self):
        """fp32 master weights kept beside a bf16/fp16 module (None where the strategy's shards are the masters)."""
        return self.strategy.masters

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
    def forward_context(self):
        """Autocast (and, under tensor parallelism, the vocab-parallel loss) for forward passes."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.precision.autocast())
        stack.enter_context(self._loss_context())
        return stack

    def __call__(self, *args, **kwargs):
        self.runner.check_direct_use("engine(...)")
        self.strategy.before_forward(self.is_gradient_accumulation_boundary())
        if getattr(self.precision.cfg, "auto_cast", False):  # DeepSpeed's fp16.auto_cast
            args, kwargs = _half_inputs(args), _half_inputs(kwargs)
        phase = "forward" if self.module.training else "eval_forward"
        with self.phases(phase), self.forward_context():
            return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> Engine:
        self.module.train(mode)
        return self

    def eval(self) -> Engine:
        return self.train(False)

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = True) -> None:
        """Backward of loss x loss_scale / gradient_accumulation_steps (averaged over the window exactly once)."""
        self.runner.check_direct_use("engine.backward")
        if scale_wrt_gas and self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        if self.precision.loss_scaler is not None:
            loss = loss * self.precision.loss_scale
        with self.phases("backward"), self._loss_context():
            loss.backward()

    def step(self) -> None:
        """Call after every micro-batch; at the accumulation boundary take (or skip) the optimizer step."""
        self.runner.check_direct_use("engine.step")
        if self.is_gradient_accumulation_boundary():
            self._take_model_step()
        self.micro_steps += 1

    def train_batch(self, next_batch: Callable[[], dict], loss_terms=()) -> dict[str, torch.Tensor]:
        """One optimizer step over gradient_accumulation_steps micro-batches drawn from next_batch()
        (dicts with input_ids and labels); returns each loss term summed over them (this rank's)."""
        return self.runner.train_batch(self, next_batch, loss_terms)

    @torch.no_grad()
    def eval_loss(self, batches) -> float:
        """The mean validation loss over `batches`, the same value on every rank."""
        return self.runner.eval_loss(self, batches)

    def step_after_accumulation(self, micro_batches: int) -> None:
        """For runners that ran all micro-batches themselves (a pipeline schedule): the optimizer step."""
        self._take_model_step()
        self.micro_steps += micro_batches

    def _take_model_step(self) -> None:
        """Overflow check, unscale+clip in one pass, optimizer and schedule step (DeepSpeed's order).

        Overflow (inf/nan in any gradient, agreed by all ranks) skips the step: the optimizer and the
        LR schedule do not advance, global_steps does (as in DeepSpeed), skipped_steps counts it.
        """
        precision, strategy = self.precision, self.strategy
        with self.phases("grad_reduce"):
            strategy.reduce_gradients()
        with self.phases("optimizer"):
            self._optimizer_step(precision, strategy)
        self.global_steps += 1
        self.global_samples += self.train_batch_size

    def _optimizer_step(self, precision: Precision, strategy) -> None:
        """Norm, overflow verdict, unscale + clip, optimizer and schedule step, zero_grad (see _take_model_step)."""
        scale = precision.loss_scale  # the scale the backward used, before this step's update
        # Every rank sees the same norm (the strategy reduces the partial norms), so all ranks reach the
        # same overflow verdict together without another collective.
        norm = strategy.grad_norm()
        overflow = not bool(torch.isfinite(norm))
        self.last_step_skipped = overflow
        if precision.loss_scaler is not None:
            precision.loss_scaler.update_scale(overflow)
        elif overflow and precision.cfg.nonfinite_grads == "error":
            raise FloatingPointError(
                f"non-finite gradients (inf/nan) at step {self.global_steps + 1}: the loss or a gradient "
                f"overflowed in {precision.name}. Lower the learning rate, or set "
                "precision.nonfinite_grads=skip to skip such steps"
            )
        if overflow:
            self.skipped_steps += 1
            self.last_grad_norm = float("nan")
        else:
            true_norm = float(norm) / scale
            self.last_grad_norm = true_norm
            combined_scale = scale
            if self.gradient_clipping > 0:
                clip = (true_norm + 1e-6) / self.gradient_clipping
                if clip > 1:
                    combined_scale = clip * scale
            if combined_scale != 1.0:
                strategy.scale_grads(1.0 / combined_scale)
            self.optimizer.step()
            strategy.after_step()
            for hook in self.post_step_hooks:
                hook()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
        strategy.zero_grad()

    def get_lr(self) -> list[float]:
        """Each parameter group's lr, as floats (torchao's optimizers hold it as a tensor)."""
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    # ------------------------------------------------------------------ checkpoints
    def module_state_dict(self) -> dict:
        """The module's full weights at full precision (fp32 masters when the model runs in bf16/fp16).

        A collective under FSDP2, expert and pipeline parallelism: every rank must call it; the values
        land on CPU on every rank.
        """
        return self.plan.full_model_state()

    def counters_state(self, client_state: dict | None) -> dict:
        """Counters, LR schedule and loss scaler: what engine.pt holds."""
        scaler = self.precision.loss_scaler
        return {
            "global_steps": self.global_steps,
            "global_samples": self.global_samples,
            "micro_steps": self.micro_steps,
            "skipped_steps": self.skipped_steps,
            "dp_world_size": self.batch.dp_world_size,
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            "loss_scaler": scaler.state_dict() if scaler is not None else None,
            "client_state": client_state or {},
        }

    def load_counters_state(self, state: dict, load_optimizer_states: bool = True) -> None:
        if load_optimizer_states:
            if self.lr_scheduler is not None and state["lr_scheduler"] is not None:
                self.lr_scheduler.load_state_dict(state["lr_scheduler"])
            if self.precision.loss_scaler is not None and state.get("loss_scaler") is not None:
                self.precision.loss_scaler.load_state_dict(state["loss_scaler"])
        self.global_steps = state["global_steps"]
        self.global_samples = state["global_samples"]
        self.micro_steps = state["micro_steps"]
        self.skipped_steps = state.get("skipped_steps", 0)

    def save_checkpoint(self, save_dir: str | os.PathLike, tag: str | None = None, client_state: dict | None = None) -> Path:
        """Atomically write `<save_dir>/<tag>/` (tag defaults to `step_<global_steps>`) and update `latest`.

        Call on every rank. Holds the model (full precision), optimizer, LR schedule, loss scaler,
        step counters, each rank's RNG states, the caller's client_state (e.g. the data position)
        and the resolved config. A SIGINT/SIGTERM arriving meanwhile (under stop_on_signals) stops the run once the
        checkpoint is complete (dsrecipes.utils.interrupts.signals_held).
        """
        with signals_held():
            return engine_checkpoint.save(self, save_dir, tag or f"step_{self.global_steps}", client_state)

    def load_checkpoint(
        self, load_dir: str | os.PathLike, tag: str | None = None, load_optimizer_states: bool = True
    ) -> tuple[Path, dict]:
        """Restore from `<load_dir>/<tag>` (default: `latest`); returns (path, client_state).

        Every tensor is checked against the model first: a missing, unexpected or differently shaped
        tensor raises ValueError naming it, and nothing is loaded. Sharded (dcp/) checkpoints load at
        any world size and into any strategy that uses them.
        """
        return engine_checkpoint.load(self, load_dir, tag, load_optimizer_states)


def _half_inputs(value):
    """Floating tensors (inside lists, tuples and dicts too) cast to fp16, the rest as they are: what DeepSpeed's
    engine does to the forward's inputs with fp16.auto_cast (its _cast_inputs_half)."""
    if isinstance(value, torch.Tensor):
        return value.half() if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_half_inputs(v) for v in value)
    if isinstance(value, dict):
        return {k: _half_inputs(v) for k, v in value.items()}
    return value
