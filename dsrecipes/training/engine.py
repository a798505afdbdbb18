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

import contextlib
import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel as tp_loss_parallel
from torch.nn.parallel import DistributedDataParallel

from dsrecipes.training.batch import BatchSizes
from dsrecipes.distributed.expert_parallel import ExpertParallel, is_expert_param
from dsrecipes.distributed.pipeline_parallel import PipelineParallel
from dsrecipes.distributed.sequence_parallel import SequenceParallel
from dsrecipes.distributed.zero import unwrap
from dsrecipes.distributed.zero2 import ZeroStage2
from dsrecipes.training.checkpoint import (
    COMPLETE_MARKER,
    barrier,
    begin_checkpoint,
    check_state_dict_matches,
    finish_checkpoint,
    read_checkpoint,
    resolve_checkpoint_dir,
)
from dsrecipes.training.precision import Precision
from dsrecipes.utils.seed import rng_state, set_rng_state

DCP_DIR = "dcp"
# Sharded (DCP) checkpoints key every optimizer value by parameter name ("state.<fqn>.exp_avg",
# "param_groups.<fqn>.lr"), not by position in a param-group list: pipeline stages (which hold
# different parameters) then write disjoint keys, and any layout reads back the entries it needs.
SHARDED_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


@contextlib.contextmanager
def _single_process_dcp_quiet():
    """DCP warns on every save/load without a process group; in a single process that is expected."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def grad_groups(
    params: list[torch.Tensor], expert_parallel: ExpertParallel | None = None, duplicates: set[int] | None = None
) -> dict[tuple, list[torch.Tensor]]:
    """Gradients grouped by how their norm combines across ranks (and so they can share foreach calls):

    ("plain",): replicated tensors (DDP / single process), identical on the ranks that share them
    (under pipeline parallelism: this stage's, different on every stage);
    ("duplicate",): copies counted elsewhere (a pipeline's second copy of a tied weight): scaled, not counted;
    ("expert",): expert-parallel experts, different on every EP rank;
    ("dtensor", mesh, placements): FSDP2 / tensor-parallel shards, one group per layout.
    """
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        g = p.grad
        if duplicates and id(p) in duplicates:
            key = ("duplicate",)
        elif expert_parallel is not None and is_expert_param(p):
            key = ("expert",)
        elif isinstance(g, DTensor):
            key = ("dtensor", id(g.device_mesh), tuple(g.placements))
        else:
            key = ("plain",)
        groups.setdefault(key, []).append(g)
    return groups


def global_grad_norm(
    groups: dict[tuple, list[torch.Tensor]],
    expert_parallel: ExpertParallel | None = None,
    stage_group=None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """The L2 norm of the whole model's gradient, the same value on every rank.

    stage_group: the pipeline group: every stage holds other parameters, so the stages' squared
    norms are summed over it.
    """
    squares = []
    for key, grads in groups.items():
        if key[0] == "duplicate":
            continue
        if key[0] == "expert":  # summed over the expert-parallel group, each rank holding other experts
            squares.append(expert_parallel.global_sq_norm(grads))
            continue
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if isinstance(norm, DTensor):  # sharded gradients: reduce the partial norms
            norm = norm.full_tensor()
        squares.append(norm.float().pow(2))
    total = torch.stack([sq.to(squares[0].device) for sq in squares]).sum() if squares else torch.zeros((), device=device)
    if stage_group is not None:
        total = total.reshape(1).clone()
        dist.all_reduce(total, group=stage_group)
        total = total[0]
    return total.sqrt()


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
        rank: int = 0,
        sharded_params: bool = False,
        expert_parallel: ExpertParallel | None = None,
        loss_parallel: bool = False,
        sequence_parallel: SequenceParallel | None = None,
        pipeline: PipelineParallel | None = None,
        zero2: ZeroStage2 | None = None,
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
        self.skipped_steps = 0
        self.last_grad_norm: float | None = None
        self.last_step_skipped = False
        self.rank = rank
        self.is_writer = rank == 0
        self.expert_parallel = expert_parallel  # MoE experts sharded over ranks (None: no expert parallelism)
        self.sequence_parallel = sequence_parallel  # Ulysses: the loop feeds this rank's sequence chunk
        self.pipeline = pipeline  # pipeline parallel: `module` holds this rank's stages, the schedule runs them
        self.zero2 = zero2  # ZeRO-2 with replicated parameters: the optimizer steps its sharded masters
        # tensor parallelism: the vocab-parallel loss's forward and backward run under torch's loss_parallel
        self._loss_context = tp_loss_parallel if loss_parallel else contextlib.nullcontext
        if not sharded_params and zero2 is None:  # FSDP2's / ZeRO-2's fp32 shards already are the masters
            precision.attach(unwrap(module))

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
        if isinstance(self.module, DistributedDataParallel):
            # gradients are all-reduced only at the accumulation boundary (ZeRO 0/1, as DeepSpeed)
            self.module.require_backward_grad_sync = self.is_gradient_accumulation_boundary()
        with self.precision.autocast(), self._loss_context():
            return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> "Engine":
        self.module.train(mode)
        return self

    def eval(self) -> "Engine":
        return self.train(False)

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = True) -> None:
        """Backward of loss x loss_scale / gradient_accumulation_steps (averaged over the window exactly once)."""
        if scale_wrt_gas and self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        if self.precision.loss_scaler is not None:
            loss = loss * self.precision.loss_scale
        with self._loss_context():
            loss.backward()

    def pipeline_train_step(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Pipeline parallelism: all gradient_accumulation_steps micro-batches ([gas x micro, T]) through the
        schedule (forward + backward, gradients averaged over them), then the optimizer step; returns
        the mean loss (the same value on every rank)."""
        with self.precision.autocast(), self._loss_context():
            loss = self.pipeline.train_step(input_ids, labels)
        self._take_model_step()
        self.micro_steps += self.gradient_accumulation_steps
        return loss

    @torch.no_grad()
    def pipeline_eval_loss(self, input_ids: torch.Tensor, labels: torch.Tensor) -> float:
        """Pipeline parallelism: the mean validation loss of gradient_accumulation_steps micro-batches."""
        with self.precision.autocast(), self._loss_context():
            return self.pipeline.eval_loss(input_ids, labels)

    def step(self) -> None:
        """Call after every micro-batch; at the accumulation boundary take (or skip) the optimizer step."""
        if self.is_gradient_accumulation_boundary():
            self._take_model_step()
        self.micro_steps += 1

    def _take_model_step(self) -> None:
        """Overflow check, unscale+clip in one pass, optimizer and schedule step (DeepSpeed's order).

        Overflow (inf/nan in any gradient, agreed by all ranks) skips the step: the optimizer and the
        LR schedule do not advance, global_steps does (as in DeepSpeed), skipped_steps counts it.
        """
        precision = self.precision
        if precision.master is not None:
            precision.master.grads_to_master()
        ep = self.expert_parallel
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        if ep is not None:
            ep.reduce_gradients(params)
        pipe = self.pipeline
        scale = precision.loss_scale  # the scale the backward used, before this step's update
        if self.zero2 is not None:  # ZeRO-2's flat shard buffers: one norm per bucket, one all-reduce
            norm, scale_grads = self.zero2.grad_norm(), self.zero2.scale_grads
        else:
            groups = grad_groups(params, ep, duplicates=pipe.norm_duplicates() if pipe is not None else None)
            norm = global_grad_norm(groups, ep, stage_group=pipe.group if pipe is not None else None, device=self.device)

            def scale_grads(factor: float) -> None:
                for grads in groups.values():
                    torch._foreach_mul_(grads, factor)
        # Every rank sees the same norm (DDP/ZeRO-1 gradients are already all-reduced, FSDP2's partial
        # norms are reduced by full_tensor), so all ranks reach the same overflow verdict together
        # without another collective.
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
                scale_grads(1.0 / combined_scale)
            self.optimizer.step()
            if self.zero2 is not None:  # every rank's updated shard into every rank's parameters
                self.zero2.gather_params()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
            if precision.master is not None:
                precision.master.master_to_model()
        self.optimizer.zero_grad(set_to_none=True)
        self.module.zero_grad(set_to_none=True)
        self.global_steps += 1
        self.global_samples += self.train_batch_size

    def sharding_summary(self) -> str:
        """One line for the run log: what replicates or shards the model state over the ranks."""
        if self.zero2 is not None:
            return (f"ZeRO-2: parameters replicated, gradients and optimizer state sharded over "
                    f"{self.zero2.world} ranks ({len(self.zero2.buckets)} gradient bucket(s))")
        if isinstance(unwrap(self.module), FSDPModule):
            return "FSDP2: parameters, gradients and optimizer state sharded"
        if isinstance(self.module, DistributedDataParallel):
            if isinstance(self.optimizer, ZeroRedundancyOptimizer):
                return "DDP + ZeroRedundancyOptimizer: optimizer state sharded"
            return "DDP: model state replicated"
        return "one data-parallel rank: nothing sharded"

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    # ------------------------------------------------------------------ checkpoints
    @property
    def _uses_dcp(self) -> bool:
        """torch.distributed.checkpoint describes plain, DDP and FSDP2 models with torch optimizers;
        ZeRO-1's ZeroRedundancyOptimizer and fp32 master weights use the full-state files instead."""
        return not isinstance(self.optimizer, ZeroRedundancyOptimizer) and self.precision.master is None

    @property
    def _state_module(self) -> nn.Module:
        """The module whose parameters the optimizer steps (ZeRO-2: the tree of sharded masters)."""
        return self.zero2.shadow if self.zero2 is not None else self.module

    def module_state_dict(self) -> dict:
        """The module's full weights at full precision (fp32 masters when the model runs in bf16/fp16).

        A collective under FSDP2: every rank must call it; the values land on CPU on every rank.
        """
        if self.precision.master is not None:
            state = self.precision.master.master_state_dict(unwrap(self.module))
        else:
            state = get_model_state_dict(self._state_module, options=StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=False))
        if self.expert_parallel is not None:
            state = self.expert_parallel.gather_full(state, unwrap(self.module))
        if self.pipeline is not None:  # every stage's tensors, gathered from the pipeline group
            state = self.pipeline.full_state_dict()
        return state

    def _engine_state(self, client_state: dict | None) -> dict:
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

    def save_checkpoint(self, save_dir: str | os.PathLike, tag: str | None = None, client_state: dict | None = None) -> Path:
        """Atomically write <save_dir>/<tag>/ (tag defaults to step_<global_steps>) and update `latest`.

        Call on every rank. Holds the model (full precision), optimizer, LR schedule, loss scaler,
        step counters, each rank's RNG states, the caller's client_state (e.g. the data position)
        and the resolved config.
        """
        tag = tag or f"step_{self.global_steps}"
        tmp = begin_checkpoint(save_dir, tag, self.is_writer)
        if self._uses_dcp:
            model_state, optimizer_state = get_state_dict(self._state_module, self.optimizer, options=SHARDED_OPTIONS)
            if self.expert_parallel is not None:  # experts as DTensors: DCP stores the global [E, ...] tensors
                model_state, optimizer_state = self.expert_parallel.to_checkpoint(model_state, optimizer_state)
            with _single_process_dcp_quiet():
                dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(tmp / DCP_DIR))
        else:
            if isinstance(self.optimizer, ZeroRedundancyOptimizer):
                self.optimizer.consolidate_state_dict(to=0)
            model_state = self.module_state_dict()
            if self.is_writer:
                torch.save(model_state, tmp / "model.pt")
                torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(rng_state(), tmp / f"rng_rank{self.rank}.pt")
        barrier()
        if self.is_writer:
            if self.config_yaml is not None:
                (tmp / "config.yaml").write_text(self.config_yaml)
            torch.save(self._engine_state(client_state), tmp / COMPLETE_MARKER)
        return finish_checkpoint(save_dir, tag, self.is_writer, self.keep_last_checkpoints)

    def load_checkpoint(
        self, load_dir: str | os.PathLike, tag: str | None = None, load_optimizer_states: bool = True
    ) -> tuple[Path, dict]:
        """Restore from <load_dir>/<tag> (default: `latest`); returns (path, client_state).

        Every tensor is checked against the model first: a missing, unexpected or differently shaped
        tensor raises ValueError naming it, and nothing is loaded. Sharded (dcp/) checkpoints load at
        any world size and into any ZeRO stage that uses them.
        """
        path = resolve_checkpoint_dir(load_dir, tag)
        state = read_checkpoint(path, COMPLETE_MARKER)
        if (path / DCP_DIR).exists():
            self._load_dcp(path, load_optimizer_states)
        else:
            self._load_full_state(path, load_optimizer_states)
        if load_optimizer_states:
            if self.lr_scheduler is not None and state["lr_scheduler"] is not None:
                self.lr_scheduler.load_state_dict(state["lr_scheduler"])
            if self.precision.loss_scaler is not None and state.get("loss_scaler") is not None:
                self.precision.loss_scaler.load_state_dict(state["loss_scaler"])
        self.global_steps = state["global_steps"]
        self.global_samples = state["global_samples"]
        self.micro_steps = state["micro_steps"]
        self.skipped_steps = state.get("skipped_steps", 0)
        rng_file = path / f"rng_rank{self.rank}.pt"
        set_rng_state(read_checkpoint(path, rng_file.name if rng_file.exists() else "rng_rank0.pt"))
        return path, state["client_state"]

    def _load_dcp(self, path: Path, load_optimizer_states: bool) -> None:
        if not self._uses_dcp:
            raise ValueError(
                f"checkpoint {path} is sharded (dcp/), which ZeRO-1 and precision.master_weights cannot load; "
                "resume it with zero.stage 0, 2 or 3 and without master weights"
            )
        model_state, optimizer_state = get_state_dict(self._state_module, self.optimizer, options=SHARDED_OPTIONS)
        try:
            stored = dcp.FileSystemReader(str(path / DCP_DIR)).read_metadata().state_dict_metadata
        except Exception as error:  # a missing or truncated .metadata file
            raise ValueError(f"checkpoint {path / DCP_DIR} is truncated or corrupt ({error})") from error
        loaded = {k[len("model."):]: v for k, v in stored.items() if k.startswith("model.")}
        # Expert tensors load through DTensor views of the local shards (any stored EP degree works);
        # the views share storage, so the plain dicts below receive the values too.
        global_model, global_optimizer = model_state, optimizer_state
        if self.expert_parallel is not None:
            global_model, global_optimizer = self.expert_parallel.to_checkpoint(model_state, optimizer_state)
        # a pipeline stage loads its own part of a checkpoint that holds the whole model
        check_state_dict_matches(global_model, loaded, path / DCP_DIR, allow_extra=self.pipeline is not None)
        to_load = {"model": global_model}
        if load_optimizer_states:
            # parameters that never received a gradient before the save (unused layers) have no stored
            # optimizer state: read what exists, and those start fresh after loading as they would have
            fresh = {k for k in global_optimizer if k.startswith("state.") and f"optimizer.{k}" not in stored}
            to_load["optimizer"] = {k: v for k, v in global_optimizer.items() if k not in fresh}
        try:
            with _single_process_dcp_quiet():
                dcp.load(to_load, checkpoint_id=str(path / DCP_DIR))
        except (Exception, CheckpointException) as error:  # CheckpointException is a BaseException
            causes = getattr(error, "failures", {}) or {0: error}
            reason = "; ".join(f"rank {r}: {type(e).__name__} {e}".strip() for r, e in causes.items())
            raise ValueError(f"checkpoint {path / DCP_DIR} could not be read, it may be truncated or corrupt ({reason})") from error
        if load_optimizer_states:
            # values DCP replaced rather than filled in place (hyperparameters) live in the loaded copy
            optimizer_state.update({k: v for k, v in global_optimizer.items() if not isinstance(v, torch.Tensor)})
            set_state_dict(self._state_module, self.optimizer, model_state_dict=model_state,
                           optim_state_dict=optimizer_state, options=SHARDED_OPTIONS)
            if fresh:  # "state.<fqn>.<name>": forget the placeholder state DCP's helpers created for them
                self._drop_optimizer_state({key.split(".", 1)[1].rsplit(".", 1)[0] for key in fresh})
        else:
            set_model_state_dict(self._state_module, model_state)
        if self.zero2 is not None:  # the loaded shards into the full parameters
            self.zero2.gather_params()

    def _drop_optimizer_state(self, names: set[str]) -> None:
        for name, param in self._state_module.named_parameters(remove_duplicate=False):
            if name in names:
                self.optimizer.state.pop(param, None)

    def _load_full_state(self, path: Path, load_optimizer_states: bool) -> None:
        model_state = read_checkpoint(path, "model.pt")
        check_state_dict_matches(self.module_state_dict(), model_state, path / "model.pt")
        if self.precision.master is not None:
            self.precision.master.load_master_state_dict(unwrap(self.module), model_state)
        else:
            set_model_state_dict(self._state_module, model_state, options=StateDictOptions(full_state_dict=True))
            if self.zero2 is not None:
                self.zero2.gather_params()
        if load_optimizer_states:
            if isinstance(unwrap(self.module), FSDPModule) or self.zero2 is not None:
                raise ValueError(
                    f"checkpoint {path} holds full-state (ZeRO-1 / master-weight) optimizer state, which a "
                    "ZeRO-2/3 run cannot take; resume it with the zero.stage and precision that wrote it"
                )
            self.optimizer.load_state_dict(read_checkpoint(path, "optimizer.pt", map_location=self.device))
