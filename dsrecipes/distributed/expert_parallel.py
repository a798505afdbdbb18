"""Expert parallelism: MoE experts sharded over an `ep` axis, everything else data parallel.

Layout (DeepSpeed's default): world = edp x ep with consecutive ranks forming an expert-parallel
group, so ranks r and r + ep hold the same experts (their expert-data-parallel group). Every MoE
layer keeps experts [ep_rank * E/ep, (ep_rank+1) * E/ep); tokens reach them by all_to_all.

With tensor parallelism (parallel.tp > 1) the mesh is (edp, ep, etp), etp being the tp axis: ep
groups hold ranks of one tp rank, and every expert's hidden width is sliced over etp (expert-tensor
parallelism, `Experts.keep_hidden_slice`): the tp ranks see the same tokens (so route them alike)
and sum their partial expert outputs. This also runs at ep_size 1, so that experts stay out of
FSDP2 (whose shards would mix different tp ranks' slices). `edp_group` keeps its meaning: the
ranks holding the same expert tensors.

What the Engine asks of an ExpertParallel (it is None without MoE or at ep_size=1):
* `ignored_params`: the expert weights, kept out of DDP / FSDP2 (they differ across ranks).
* `reduce_gradients`: at the accumulation boundary, expert gradients are summed over the
  expert-data-parallel group and divided by the data-parallel size (world / tp). After the all_to_all backward, the rank
  holding an expert already has the sum over its EP group's losses, so this gives exactly the
  data-parallel mean that DDP / FSDP2 give the other parameters.
* `global_sq_norm`: the squared norm of the expert gradients over the whole model (summed over
  the EP group: each holds different experts; and over etp for the hidden slices), for clipping and
  overflow detection.
* `to_checkpoint`: state dicts whose expert tensors are DTensors sharded on the expert dim (and the
  hidden dim over etp), so DCP stores global [E, ...] tensors and a checkpoint resumes at any EP / TP
  degree (EP=2 -> EP=1 included).
* `gather_full`, `full_optimizer_state`: full [E, ...] expert tensors (weights, optimizer moments) on
  every rank, for exports and full-state checkpoints (fp32 master weights at zero.stage 0);
  `local_model_state` / `local_optimizer_state` cut such full dicts back to this rank's slices on load,
  so they resume at any EP degree.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from dsrecipes.models.moe import MoELayer

EXPERT_ATTR = "_dsrecipes_expert"  # marks expert parameters (like DeepSpeed's param.allreduce=False)


def is_expert_param(param: torch.Tensor) -> bool:
    return bool(getattr(param, EXPERT_ATTR, False))


class ExpertParallel:
    def __init__(self, model: nn.Module, mesh: DeviceMesh):
        """mesh: ParallelDims.get_mesh("expert"): (edp, ep), or (edp, ep, etp) under tensor parallelism."""
        self.mesh = mesh
        self.tp_size = mesh["etp"].size() if "etp" in mesh.mesh_dim_names else 1
        self.ep_size, self.world = mesh["ep"].size(), mesh.size() // self.tp_size  # world: data-parallel ranks
        self.ep_group = mesh.get_group("ep")
        self.edp_group = mesh.get_group("edp")  # the ranks holding the same expert tensors
        self.tp_group = mesh.get_group("etp") if self.tp_size > 1 else None
        self.ep_rank = mesh.get_local_rank("ep")
        ep_size = self.ep_size
        self.hidden_dims: dict[str, int | None] = {}  # expert fqn -> its dim sliced over etp (None: whole)
        self.expert_names: set[str] = set()
        self.params: list[nn.Parameter] = []
        self._fqns: list[str] = []  # the fqn of each of self.params
        self._whole: list[nn.Parameter] = []  # under etp: expert tensors every tp rank holds whole (b_out)
        for layer_name, layer in model.named_modules():
            if not isinstance(layer, MoELayer):
                continue
            layer.experts.keep_local(self.ep_rank, ep_size)
            if self.tp_size > 1:
                layer.experts.keep_hidden_slice(mesh.get_local_rank("etp"), self.tp_size, self.tp_group)
            layer.ep_group, layer.ep_size = self.ep_group, ep_size
            for name, param in layer.experts.named_parameters():
                setattr(param, EXPERT_ATTR, True)
                fqn = f"{layer_name}.experts.{name}"
                self.expert_names.add(fqn)
                self._fqns.append(fqn)
                self.hidden_dims[fqn] = layer.experts.hidden_dim(name) if self.tp_size > 1 else None
                self.params.append(param)
                if self.tp_size > 1 and self.hidden_dims[fqn] is None:
                    self._whole.append(param)
        if not self.params:
            raise ValueError(f"moe.ep_size={ep_size} but the model has no MoE layers (moe.num_experts=0?)")

    @property
    def ignored_params(self) -> set[nn.Parameter]:
        return set(self.params)

    # ------------------------------------------------------------------ gradients
    @torch.no_grad()
    def reduce_gradients(self, params) -> None:
        """Sum expert gradients over the expert-data-parallel group, then divide by the world size."""
        grads = [p.grad for p in params if p.grad is not None and is_expert_param(p)]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        if self.world // self.ep_size > 1:
            dist.all_reduce(flat, group=self.edp_group)
        flat.div_(self.world)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def global_sq_norm(self, expert_grads: list[torch.Tensor]) -> torch.Tensor:
        """Sum of squares over every expert tensor of the model; under etp, tensors not sliced over it
        (b_out: the same on every tp rank) count 1/tp on each rank."""
        device = expert_grads[0].device if expert_grads else None
        whole = {id(p.grad) for p in self._whole if p.grad is not None}
        local = torch.zeros((), device=device)
        for g in expert_grads:
            square = g.float().pow(2).sum()
            local = local + (square / self.tp_size if id(g) in whole else square)
        local = local.reshape(1)
        dist.all_reduce(local, group=self.ep_group)
        if self.tp_group is not None:
            dist.all_reduce(local, group=self.tp_group)
        return local[0]

    # ------------------------------------------------------------------ state dicts
    def _as_dtensor(self, tensor: torch.Tensor, fqn: str) -> torch.Tensor:
        if isinstance(tensor, DTensor) or tensor.dim() == 0:
            return tensor
        placements = [Replicate(), Shard(0)]
        if self.tp_size > 1:
            dim = self.hidden_dims[fqn]
            placements.append(Replicate() if dim is None else Shard(dim))
        return DTensor.from_local(tensor, self.mesh, placements, run_check=False)

    def to_checkpoint(self, model_state: dict, optimizer_state: dict | None = None) -> tuple[dict, dict | None]:
        """Copies of the state dicts with expert entries as DTensors (sharing the local storage)."""
        model_state = {k: self._as_dtensor(v, k) if k in self.expert_names else v for k, v in model_state.items()}
        if optimizer_state is not None:  # flattened: "state.<fqn>.<name>" keys
            optimizer_state = {k: self._as_dtensor(v, self._expert_of_state(k)) if self._expert_of_state(k) else v
                               for k, v in optimizer_state.items()}
        return model_state, optimizer_state

    def _expert_of_state(self, key: str) -> str | None:
        """The expert fqn of a flattened optimizer-state key ("state.<fqn>.<name>"), or None."""
        if not key.startswith("state."):
            return None
        fqn = key[len("state."):].rsplit(".", 1)[0]
        return fqn if fqn in self.expert_names else None

    def gather_full(self, state: dict, module: nn.Module) -> dict:
        """`state` with each expert tensor replaced by the full [E, ...] tensor, gathered from the local
        experts in `state` (fp32 masters where the strategy keeps them), else the module's (a collective
        over the EP group: every rank calls it, even those whose state dict is empty, e.g. ranks other
        than 0 under a rank-0 full state dict)."""
        out = dict(state)
        params = dict(module.named_parameters())
        for name in sorted(self.expert_names):
            device = params[name].device  # the collective's device (a full state dict may sit on the CPU)
            full = (state[name] if name in state else params[name]).detach().to(device, torch.float32).contiguous()
            if self.hidden_dims[name] is not None:  # the hidden slices of the tp ranks first
                full = _all_gather_cat(full, self.tp_group, self.tp_size, self.hidden_dims[name])
            full = _all_gather_cat(full, self.ep_group, self.ep_size, 0)
            if name in state:
                out[name] = full.to(state[name].device, state[name].dtype)
        return out


    def local_model_state(self, state: dict) -> dict:
        """A full state dict (every expert whole) cut down to this rank's expert slices."""
        return {k: self._local_slice(v, k) if k in self.expert_names else v for k, v in state.items()}

    def _local_slice(self, full: torch.Tensor, fqn: str) -> torch.Tensor:
        per_rank = full.shape[0] // self.ep_size
        local = full.narrow(0, self.ep_rank * per_rank, per_rank)
        dim = self.hidden_dims[fqn]
        if dim is not None:
            width = local.shape[dim] // self.tp_size
            local = local.narrow(dim, self.mesh.get_local_rank("etp") * width, width)
        return local.contiguous()

    def _expert_indices(self, optimizer: torch.optim.Optimizer) -> dict[int, str]:
        """optimizer.state_dict()'s parameter index -> expert fqn, for the expert parameters it steps."""
        names = {id(p): fqn for p, fqn in zip(self.params, self._fqns, strict=True)}
        params = [p for group in optimizer.param_groups for p in group["params"]]
        return {index: names[id(p)] for index, p in enumerate(params) if id(p) in names}

    def full_optimizer_state(self, state_dict: dict, optimizer: torch.optim.Optimizer) -> dict:
        """optimizer.state_dict() with every expert's state whole (gathered over ep / etp; a collective)."""
        return self._map_optimizer_state(state_dict, optimizer, self._gather_one)

    def local_optimizer_state(self, state_dict: dict, optimizer: torch.optim.Optimizer) -> dict:
        """A full_optimizer_state dict cut down to this rank's expert slices (to load it here)."""
        return self._map_optimizer_state(state_dict, optimizer, self._local_slice)

    def _gather_one(self, local: torch.Tensor, fqn: str) -> torch.Tensor:
        full = local.contiguous()
        if self.hidden_dims[fqn] is not None:
            full = _all_gather_cat(full, self.tp_group, self.tp_size, self.hidden_dims[fqn])
        return _all_gather_cat(full, self.ep_group, self.ep_size, 0)

    def _map_optimizer_state(self, state_dict: dict, optimizer: torch.optim.Optimizer, fn) -> dict:
        out = {**state_dict, "state": dict(state_dict["state"])}
        for index, fqn in sorted(self._expert_indices(optimizer).items()):
            if index in out["state"]:  # tensors shaped like the parameter (moments), not scalars (step)
                out["state"][index] = {k: fn(v, fqn) if isinstance(v, torch.Tensor) and v.dim() > 0 else v
                                       for k, v in out["state"][index].items()}
        return out


def _all_gather_cat(local: torch.Tensor, group, size: int, dim: int) -> torch.Tensor:
    if size == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local, group=group)
    return torch.cat(parts, dim=dim).contiguous()


def split_expert_param_groups(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    """Move MoE expert weights into param groups of their own (same hyperparameters), in place.

    As DeepSpeed's split_params_into_different_moe_groups_for_optimizer: an optimizer's foreach
    kernels run per group, and under FSDP2 expert weights (plain tensors) cannot share a group with
    the sharded DTensor parameters. Done for every MoE model, at any EP degree, so optimizer state
    dicts have the same groups whatever the layout that wrote them.
    """
    from dsrecipes.models.moe import Experts

    expert_ids = {id(p) for m in model.modules() if isinstance(m, Experts) for p in m.parameters()}
    if not expert_ids:
        return
    extra = []
    for group in optimizer.param_groups:
        experts = [p for p in group["params"] if id(p) in expert_ids]
        if experts:
            group["params"] = [p for p in group["params"] if id(p) not in expert_ids]
            extra.append({**group, "params": experts})
    for group in extra:
        optimizer.add_param_group(group)


def setup_expert_parallel(model: nn.Module, dims) -> ExpertParallel | None:
    """Shard the model's experts over dims.ep ranks and their hidden width over dims.tp (None when both
    are 1 or the model has no MoE layers; dims: ParallelDims)."""
    if dims.ep <= 1 and (dims.tp <= 1 or not any(isinstance(m, MoELayer) for m in model.modules())):
        return None
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"moe.ep_size={dims.ep} needs a distributed run (launcher.nproc_per_node >= {dims.ep})")
    return ExpertParallel(model, dims.get_mesh("expert"))
