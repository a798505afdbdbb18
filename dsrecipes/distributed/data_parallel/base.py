"""The data-parallel strategy interface: everything that differs between DDP, ZeRO-1/2/3 and friends.

A strategy is built once per run by `dsrecipes.distributed.data_parallel.build_strategy` (the choice is
the table in that package's __init__), after the model-parallel steps of `parallelize`, and the
Engine talks to it through these methods only:

    module = strategy.wrap(model)                    # DDP / FSDP2 / hooks; master weights attached first
    optimizer = strategy.adopt_optimizer(build(strategy.optimizer_module()))   # ZeRO-1/2 partition it
    per micro-batch:  strategy.before_forward(boundary); forward; loss.backward()
    at the boundary:  strategy.reduce_gradients(); norm = strategy.grad_norm(); strategy.scale_grads(f)
                      optimizer.step(); strategy.after_step(); strategy.zero_grad()
    pruning masks:    strategy.apply_masks({name: mask})   # every copy of the weight: shards, fp32 masters
    checkpoints:      strategy.checkpoint_format ("dcp" | "full"), state_module, full_state_dict(), ...

The default implementations here are those of a mechanism that keeps whole parameters and whole
gradients on every rank (no data parallelism, DDP): subclasses override what their mechanism does
differently. The global gradient norm also folds in the model-parallel axes the strategy is told
about (`GradientLayout`: expert-parallel experts, pipeline stages), which are not data-parallel
mechanisms but decide how per-rank norms add up.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor

from dsrecipes.distributed.master_weights import MasterWeights
from dsrecipes.utils.dtensors import mask_

if TYPE_CHECKING:
    from dsrecipes.distributed.config import ZeroConfig
    from dsrecipes.distributed.expert_parallel import ExpertParallel
    from dsrecipes.distributed.parallel_dims import ParallelDims
    from dsrecipes.distributed.pipeline_parallel import PipelineParallel


class PrecisionPolicy(Protocol):
    """What a strategy needs to know of the run's precision (dsrecipes.training.precision.Precision has it)."""

    compute_dtype: torch.dtype
    master_weights: bool


@dataclass
class GradientLayout:
    """Model-parallel facts the global gradient norm needs: experts differ per EP rank (their squares
    are summed over the EP group), pipeline stages hold different parameters (summed over the
    pipeline group), and a pipeline's second copy of a tied weight is left out."""

    expert_parallel: ExpertParallel | None = None
    pipeline: PipelineParallel | None = None


@dataclass(frozen=True)
class ModelStateBytes:
    """Per-rank bytes of parameters, gradients and optimizer states at rest (after a step, gradients present)."""

    parameters: float
    gradients: float
    optimizer_states: float


class DataParallelStrategy:
    name: ClassVar[str] = "none"
    description: ClassVar[str] = "one data-parallel rank: nothing replicated or sharded"
    # "dcp": torch.distributed.checkpoint (sharded, any world size); "full": consolidated model.pt/optimizer.pt
    full_state_checkpoints: ClassVar[bool] = False
    # the parameters change identity when wrapping (FSDP2), so an optimizer object built before cannot be taken
    needs_own_optimizer: ClassVar[bool] = False

    def __init__(self, dims: ParallelDims, zero: ZeroConfig, precision: PrecisionPolicy, device: torch.device,
                 layout: GradientLayout | None = None):
        self.dims = dims
        self.zero = zero
        self.precision = precision
        self.device = device
        self.layout = layout or GradientLayout()
        self.module: nn.Module | None = None  # what the Engine runs (possibly a wrapper)
        self.unwrapped: nn.Module | None = None  # the user's module inside it
        self.optimizer: torch.optim.Optimizer | None = None
        self.masters: MasterWeights | None = None

    # ------------------------------------------------------------------ assembly
    @property
    def keeps_module_masters(self) -> bool:
        """Whether fp32 master weights live beside the module (strategies that keep whole parameters)."""
        return self.precision.master_weights

    @property
    def wraps_meta_parameters(self) -> bool:
        """Whether `wrap` takes a model whose parameters are still on the meta device, each rank then materializing
        only what it holds (FSDP2); the others wrap a model whose weights are in place (DDP broadcasts them)."""
        return False

    @property
    def parameter_device(self) -> torch.device:
        """Where this rank's parameters live between steps (the CPU under parameter offload)."""
        return self.device

    def wrap(self, model: nn.Module, ignored_params: set[nn.Parameter] | None = None) -> nn.Module:
        """Prepare `model` (already on its device, model-parallel steps applied) for this mechanism."""
        self._attach_masters(model)
        self.unwrapped = self.module = model
        return model

    def _attach_masters(self, model: nn.Module) -> None:
        if self.keeps_module_masters:
            self.masters = MasterWeights(model, self.precision.compute_dtype)

    def optimizer_module(self) -> nn.Module:
        """The module tree whose parameters the optimizer must step (fp32 masters when the model is low precision)."""
        return self.masters.view() if self.masters is not None else self.unwrapped

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Take the optimizer (built over optimizer_module()'s parameters); partitioning strategies rebuild it."""
        self.optimizer = optimizer
        return optimizer

    # ------------------------------------------------------------------ the loop
    def before_forward(self, boundary: bool) -> None:
        """Before a micro-batch's forward: whether its backward is the one that communicates gradients."""

    def reduce_gradients(self) -> None:
        """At the accumulation boundary, before the norm: gradients complete and averaged on every rank."""
        if self.masters is not None:
            self.masters.grads_to_master()
        ep = self.layout.expert_parallel
        if ep is not None:
            ep.reduce_gradients(self._params_with_grads())

    def _params_with_grads(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]

    def grad_norm(self) -> torch.Tensor:
        """L2 norm of the whole model's averaged gradient, the same value on every rank."""
        pipe = self.layout.pipeline
        groups = grad_groups(self._params_with_grads(), self.layout.expert_parallel,
                             duplicates=pipe.norm_duplicates() if pipe is not None else None)
        self._norm_groups = groups
        return global_grad_norm(groups, self.layout.expert_parallel,
                                stage_group=pipe.group if pipe is not None else None, device=self.device)

    def scale_grads(self, factor: float) -> None:
        """Multiply every gradient the optimizer will read (after grad_norm) by `factor` (unscale + clip)."""
        for grads in self._norm_groups.values():
            torch._foreach_mul_(grads, factor)

    def after_step(self) -> None:
        """After optimizer.step(): bring the module's parameters up to date."""
        if self.masters is not None:
            self.masters.master_to_model()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.module.zero_grad(set_to_none=True)

    @torch.no_grad()
    def apply_masks(self, masks: dict[str, torch.Tensor]) -> None:
        """Multiply 0/1 masks, keyed by parameter name (as in the unwrapped model's named_parameters) and
        each over the whole parameter (or broadcastable to it), into every copy of that parameter this
        strategy holds: the module's parameter (its local piece when it is a DTensor: FSDP2 shards,
        tensor-parallel weights) and the separate copies the optimizer steps (`optimizer_copies`).
        Called after optimizer.step() and after_step(), so pruned weights stay zero everywhere."""
        if not masks:
            return
        copies = self.optimizer_copies()
        for name, param in self.unwrapped.named_parameters(remove_duplicate=False):  # tied names too
            mask = masks.get(name)
            if mask is None:
                continue
            for tensor in (param, *copies.get(id(param), ())):
                mask_(tensor, mask)

    def optimizer_copies(self) -> dict[int, list[torch.Tensor]]:
        """id(module parameter) -> the tensors other than it that the optimizer steps for it (fp32 masters)."""
        if self.masters is None:
            return {}
        return {id(low): [master] for low, master in self.masters.pairs}

    # ------------------------------------------------------------------ checkpoints
    @property
    def uses_full_state_checkpoints(self) -> bool:
        """ZeRO-1's optimizer and fp32 master weights beside the module are saved as consolidated files."""
        return self.full_state_checkpoints or self.masters is not None

    @property
    def state_module(self) -> nn.Module:
        """The module tree whose parameters the optimizer steps, for DCP's state-dict helpers."""
        return self.module

    def full_state_dict(self) -> dict:
        """The module's full weights at full precision, on CPU (a collective where parameters are sharded)."""
        if self.masters is not None:
            return self.masters.master_state_dict(self.unwrapped)
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=False)
        return get_model_state_dict(self.state_module, options=options)

    def prepare_full_save(self) -> None:
        """Before a full-state save: gather what the writing rank must write."""

    def optimizer_state_for_save(self) -> dict:
        return self.optimizer.state_dict()

    def load_full_state(self, model_state: dict, optimizer_state_loader) -> None:
        """Load consolidated weights (and, if optimizer_state_loader is given, the optimizer state it reads)."""
        if self.masters is not None:
            self.masters.load_master_state_dict(self.unwrapped, model_state)
        else:
            set_model_state_dict(self.state_module, model_state, options=StateDictOptions(full_state_dict=True))
            self.after_load()
        if optimizer_state_loader is not None:
            self.optimizer.load_state_dict(optimizer_state_loader())

    def after_load(self) -> None:
        """After sharded (DCP) state was loaded into state_module: bring the module's parameters up to date."""

    def states_in_memory(self, writes: bool) -> contextlib.AbstractContextManager:
        """Context for a checkpoint save (writes=False) or load (True): every parameter and optimizer state in
        memory for its duration (NVMe offload swaps them in; nothing to do elsewhere)."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """At the end of the run (errors included): release what the mechanism holds outside the process."""

    def offload_metrics(self) -> dict[str, float]:
        """Run-summary figures of an offload mechanism (NVMe swap traffic); none elsewhere."""
        return {}

    # ------------------------------------------------------------------ reporting
    def describe(self) -> str:
        """One line for the run log."""
        extra = ", fp32 master weights beside the bf16/fp16 model" if self.masters is not None else ""
        return f"{self.description}{extra}"

    @classmethod
    def shard_ranks(cls, dims: ParallelDims) -> int:
        """Over how many ranks this mechanism shards what it shards (the `world` of model_state_bytes):
        1 where it keeps whole parameters, gradients and optimizer states."""
        return 1

    @classmethod
    def model_state_bytes(cls, num_params: int, world: int, model_bytes: int, state_bytes: int,
                          master_weights: bool) -> ModelStateBytes:
        """What this mechanism holds per rank for `num_params` parameters (the memory estimator's entry):
        model_bytes per parameter of the model dtype, state_bytes of optimizer state per parameter."""
        masters = 4 * num_params if master_weights else 0
        grads = 4 * num_params if master_weights else model_bytes * num_params  # grads move to the fp32 masters
        return ModelStateBytes(model_bytes * num_params + masters, grads, state_bytes * num_params)


# ---------------------------------------------------------------------------------------------------
# Global gradient norm over every kind of gradient a rank can hold
# ---------------------------------------------------------------------------------------------------


def grad_groups(params: list[torch.Tensor], expert_parallel: ExpertParallel | None = None,
                duplicates: set[int] | None = None) -> dict[tuple, list[torch.Tensor]]:
    """Gradients grouped by how their norm combines across ranks (and so they can share foreach calls):

    ("plain",): replicated tensors (DDP / single process), identical on the ranks that share them
    (under pipeline parallelism: this stage's, different on every stage);
    ("duplicate",): copies counted elsewhere (a pipeline's second copy of a tied weight): scaled, not counted;
    ("expert",): expert-parallel experts, different on every EP rank;
    ("dtensor", mesh, placements): FSDP2 / tensor-parallel shards, one group per layout.
    """
    from dsrecipes.distributed.expert_parallel import is_expert_param

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


def global_grad_norm(groups: dict[tuple, list[torch.Tensor]], expert_parallel: ExpertParallel | None = None,
                     stage_group=None, device: torch.device | None = None) -> torch.Tensor:
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
