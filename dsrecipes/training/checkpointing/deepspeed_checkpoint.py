"""Read a checkpoint written by DeepSpeed's `engine.save_checkpoint` (0.19.x) into whole, named tensors.

    ckpt = read_deepspeed_checkpoint("ds_ckpt")            # the folder holding `latest`, or a global_stepN folder
    ckpt.weights["head.weight"]                              # fp32 (the masters where DeepSpeed kept them)
    ckpt.optimizer_state["head.weight"]["exp_avg"]           # the whole moment, shaped like the parameter

What is read (DeepSpeed's layout, one data-parallel group, no tensor/pipeline parallelism, no MoE):

* ZeRO-0: `mp_rank_00_model_states.pt` holds the module's weights and the optimizer's own state_dict
  ('optimizer'; under bf16/fp16 a wrapper whose 'fp32_groups' / 'fp32_groups_flat' are the masters).
  Its state is keyed by position; positions follow the module's parameter order (checked by shape).
* ZeRO-1/2: each rank's `[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt` holds, per parameter group,
  its flat fp32 partition ('single_partition_of_fp32_groups'), the base optimizer's state over that
  partition and 'param_slice_mappings' (name -> start, numel inside the partition); a parameter is the
  concatenation of its fragments in rank order.
* ZeRO-3: every rank's flat 'fp32_flat_groups' holds, parameter after parameter in 'param_shapes'
  order, a slice of ceil(numel / world) elements; a parameter is its ranks' slices, padding dropped.
  The moments sit in the same layout. Frozen parameters come from 'frozen_param_fragments'.

Optimizer state: every per-element tensor (Adam/AdamW's exp_avg and exp_avg_sq, Lion's exp_avg,
SGD's momentum_buffer ...) is reassembled like the weights; scalar entries (`step`) are carried per
parameter. Counters (global_steps, global_samples, skipped_steps), the LR-schedule position
('lr_scheduler': DeepSpeed's `last_batch_iteration`, or a torch scheduler's state_dict) and the fp16
loss scaler are read from the model-states file. The files pickle DeepSpeed classes (loss scaler,
enums, fragment addresses); they are read with stand-ins, so deepspeed need not be installed.
Nothing here is DeepSpeed's code: the layout was learned from its save paths and checkpoints it wrote.
"""

from __future__ import annotations

import math
import pickle
import re
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch

LATEST = "latest"
MODEL_STATES = "mp_rank_00_model_states.pt"  # ZeRO 0-2 (model parallel rank 0)
ZERO3_MODEL_STATES = "zero_pp_rank_{rank}_mp_rank_00_model_states.pt"
OPTIM_STATES = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$")
_UNSUPPORTED = (  # file patterns of layouts this reader does not take, and why
    (re.compile(r"^mp_rank_(0[1-9]|[1-9]\d)_model_states\.pt$"), "tensor (model) parallelism"),
    (re.compile(r"^layer_\d+-model.*_states\.pt$"), "pipeline parallelism (PipelineModule layer files)"),
    (re.compile(r"^(expp_rank_|layer_\d+_expert_)"), "mixture-of-experts expert files"),
)


def looks_like_deepspeed_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a DeepSpeed checkpoint: a tag folder with its model-states file, or a folder whose
    `latest` names one."""
    path = Path(path)
    if _has_model_states(path):
        return True
    latest = path / LATEST
    return latest.is_file() and _has_model_states(path / latest.read_text().strip())


def _has_model_states(folder: Path) -> bool:
    return (folder / MODEL_STATES).is_file() or (folder / ZERO3_MODEL_STATES.format(rank=0)).is_file()


def resolve_deepspeed_dir(path: str | Path, tag: str | None = None) -> Path:
    """The tag folder (global_stepN) of a DeepSpeed checkpoint: `path/tag`, path itself, or what `latest` names."""
    path = Path(path)
    if tag is not None:
        path = path / tag
    elif not _has_model_states(path):
        latest = path / LATEST
        if not latest.is_file():
            raise FileNotFoundError(f"{path} is not a DeepSpeed checkpoint: expected {latest} (naming a tag folder) "
                                    f"or {path / MODEL_STATES} / {path / ZERO3_MODEL_STATES.format(rank=0)}")
        path = path / latest.read_text().strip()
    if not _has_model_states(path):
        raise FileNotFoundError(f"DeepSpeed checkpoint {path} is incomplete: neither {MODEL_STATES} nor "
                                f"{ZERO3_MODEL_STATES.format(rank=0)} is there")
    return path


@dataclass
class DeepSpeedCheckpoint:
    """A DeepSpeed checkpoint as whole tensors by parameter name (the names of the module DeepSpeed wrapped)."""

    path: Path
    zero_stage: int
    dp_world_size: int
    weights: dict[str, torch.Tensor]  # parameters (fp32 where DeepSpeed kept fp32 masters) and buffers
    optimizer_state: dict[str, dict[str, torch.Tensor]]  # parameter name -> {exp_avg: ..., step: ...}
    param_groups: list[dict]  # the base optimizer's hyperparameters, 'params' as parameter names
    global_steps: int = 0
    global_samples: int = 0
    skipped_steps: int = 0
    lr_scheduler: dict | None = None  # {'last_batch_iteration': t} (DeepSpeed's schedules) or a torch state_dict
    loss_scaler: dict | None = None  # fp16: cur_scale, cur_iter, last_overflow_iter, cur_hysteresis
    client_state: dict = field(default_factory=dict)
    ds_version: str = "unknown"


# ------------------------------------------------------------------------------------- reading the files

class _Stand_in:  # noqa: N801  (named so a stand-in's repr says what it is)
    """What an unpickled DeepSpeed object becomes: its constructor arguments and attributes, nothing else."""

    def __init__(self, *args, **kwargs):
        self.args = args
        self.__dict__.update(kwargs)

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module.split(".")[0] == "deepspeed":
            return type(name, (_Stand_in,), {"__module__": "dsrecipes.deepspeed_stand_in"})
        return super().find_class(module, name)


_PICKLE = types.SimpleNamespace(Unpickler=_Unpickler, load=pickle.load, __name__="dsrecipes_deepspeed_pickle")


def load_file(file: Path) -> dict:
    """torch.load one DeepSpeed file on CPU, DeepSpeed's classes replaced by stand-ins; a clear error if unreadable."""
    if not file.is_file():
        raise FileNotFoundError(f"DeepSpeed checkpoint {file.parent} is incomplete: {file.name} is missing")
    try:
        return torch.load(file, map_location="cpu", weights_only=False, pickle_module=_PICKLE)
    except Exception as error:  # truncated zip, unpickling failures
        raise ValueError(f"DeepSpeed checkpoint file {file} could not be read ({type(error).__name__}: {error})") from error


def read_deepspeed_checkpoint(path: str | Path, tag: str | None = None) -> DeepSpeedCheckpoint:
    """Read every file of a DeepSpeed checkpoint and reassemble whole tensors; errors name the file and what was expected."""
    folder = resolve_deepspeed_dir(path, tag)
    for file in sorted(folder.iterdir()):
        for pattern, what in _UNSUPPORTED:
            if pattern.match(file.name):
                raise ValueError(f"DeepSpeed checkpoint {folder} uses {what} ({file.name}); dsrecipes reads "
                                 "data-parallel checkpoints (ZeRO 0-3, one model-parallel rank) only")
    zero3 = not (folder / MODEL_STATES).is_file()
    model_states = load_file(folder / (ZERO3_MODEL_STATES.format(rank=0) if zero3 else MODEL_STATES))
    if not isinstance(model_states, dict) or "module" not in model_states:
        raise ValueError(f"{folder}: the model-states file has no 'module' entry; not a DeepSpeed engine checkpoint")
    dims = model_states.get("checkpoint_parallel_dimensions") or {}
    if model_states.get("mp_world_size", 1) != 1 or dims.get("tp_degree", 1) != 1 or dims.get("pp_degree", 1) != 1:
        raise ValueError(f"DeepSpeed checkpoint {folder} was written with tensor/pipeline parallelism "
                         f"(mp_world_size={model_states.get('mp_world_size')}, {dims}); only data parallelism is read")
    world = int(model_states.get("dp_world_size", 1))
    optim_files = _optimizer_files(folder, world)
    if optim_files:
        shards = [load_file(f)["optimizer_state_dict"] for f in optim_files]
        if "fp32_flat_groups" in shards[0]:
            stage, parts = 3, _zero3_state(folder, model_states, shards, world)
        elif "single_partition_of_fp32_groups" in shards[0]:
            stage, parts = _configured_stage(model_states, 2), _zero12_state(folder, model_states, shards)
        else:
            raise ValueError(f"{optim_files[0]}: neither 'fp32_flat_groups' (ZeRO-3) nor 'single_partition_of_fp32_groups' "
                             "(ZeRO-1/2) is in its optimizer_state_dict; an unknown DeepSpeed optimizer layout")
        scaler = shards[0].get("loss_scaler")
    else:
        stage, parts = 0, _zero0_state(folder, model_states)
        optimizer = model_states.get("optimizer")
        scaler = optimizer.get("loss_scaler") if isinstance(optimizer, dict) else None
    weights, optimizer_state, param_groups = parts
    known = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
             "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
             "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config",
             "ds_version", "checkpoint_parallel_dimensions"}
    return DeepSpeedCheckpoint(
        path=folder, zero_stage=stage, dp_world_size=world, weights=weights, optimizer_state=optimizer_state,
        param_groups=param_groups, global_steps=int(model_states.get("global_steps", 0)),
        global_samples=int(model_states.get("global_samples", 0)), skipped_steps=int(model_states.get("skipped_steps", 0)),
        lr_scheduler=model_states.get("lr_scheduler"), loss_scaler=_loss_scaler_state(scaler),
        client_state={k: v for k, v in model_states.items() if k not in known},
        ds_version=str(model_states.get("ds_version", "unknown")),
    )


def _configured_stage(model_states: dict, default: int) -> int:
    zero = (model_states.get("ds_config") or {}).get("zero_optimization") or {}
    return int(zero.get("stage", default)) if isinstance(zero, dict) else default


def _optimizer_files(folder: Path, world: int) -> list[Path]:
    """The ZeRO optimizer files, rank 0 .. world-1 (none at ZeRO-0); an error naming the missing ones."""
    found = {int(m.group(2)): folder / m.group(0) for f in folder.iterdir() if (m := OPTIM_STATES.match(f.name))}
    if not found:
        return []
    missing = [r for r in range(world) if r not in found]
    if missing:
        raise FileNotFoundError(f"DeepSpeed checkpoint {folder} is incomplete: dp_world_size={world} but the optimizer "
                                f"files of rank(s) {missing} (zero_pp_rank_<R>_mp_rank_00_optim_states.pt) are missing")
    return [found[r] for r in range(world)]


def _loss_scaler_state(scaler) -> dict | None:
    """The dynamic fp16 scaler's progress under dsrecipes' names (None for a static or absent scaler)."""
    if scaler is None or not getattr(scaler, "dynamic", False):
        return None
    keys = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")
    return {k: getattr(scaler, k) for k in keys if hasattr(scaler, k)}


def _parameter_names(model_states: dict) -> list[str]:
    """The module's trainable parameter names in order: the module entries that are not buffers or frozen."""
    buffers = set(model_states.get("buffer_names") or ())
    frozen = set(model_states.get("frozen_param_shapes") or ())
    return [k for k in model_states["module"] if k not in buffers and k not in frozen]


def _buffers(model_states: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model_states["module"].items() if k in set(model_states.get("buffer_names") or ())}


def _is_elementwise(value, numel: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() == numel


# ------------------------------------------------------------------------------------- ZeRO-0

def _zero0_state(folder: Path, model_states: dict):
    module, optimizer = model_states["module"], model_states.get("optimizer")
    names = _parameter_names(model_states)
    weights = {k: v.float() if v.is_floating_point() else v for k, v in module.items()}
    if not isinstance(optimizer, dict):
        return weights, {}, []
    base = optimizer.get("optimizer_state_dict", optimizer)  # bf16/fp16 wrappers hold the torch state inside
    if "state" not in base or "param_groups" not in base:
        raise ValueError(f"{folder / MODEL_STATES}: 'optimizer' holds neither a torch optimizer state_dict nor "
                         "one under 'optimizer_state_dict'; an unknown DeepSpeed ZeRO-0 optimizer layout")
    shapes = {n: module[n].shape for n in names}
    if "fp32_groups_flat" in optimizer:  # fused FP16_Optimizer: one flat master (and state) per group
        return _zero0_flat(folder, optimizer, base, names, shapes, weights)
    masters = [t for group in optimizer.get("fp32_groups", ()) for t in group]
    positions = [i for group in base["param_groups"] for i in group["params"]]
    if len(positions) != len(names):
        raise ValueError(f"{folder / MODEL_STATES}: the optimizer steps {len(positions)} parameters but the module has "
                         f"{len(names)} trainable ones; cannot tell which state is whose")
    order = dict(zip(positions, names))
    state = {}
    for position, name in order.items():
        entry = base["state"].get(position, {})
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != shapes[name]:
                raise ValueError(f"{folder / MODEL_STATES}: optimizer state {position}.{key} has shape {tuple(value.shape)}, "
                                 f"parameter {name!r} {tuple(shapes[name])}: the parameter groups are not in module order")
        state[name] = dict(entry)
    for name, master in zip(names, masters):
        weights[name] = master.float().view(shapes[name])
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [order[i] for i in g["params"]]}
              for g in base["param_groups"]]
    return weights, state, groups


def _zero0_flat(folder, optimizer, base, names, shapes, weights):
    state, groups, start = {}, [], 0
    for flat, group in zip(optimizer["fp32_groups_flat"], base["param_groups"]):
        group_names, offset = [], 0
        while offset < flat.numel() and start < len(names):
            name = names[start]
            numel = shapes[name].numel()
            weights[name] = flat[offset:offset + numel].float().view(shapes[name])
            flat_state = base["state"].get(group["params"][0], {})
            state[name] = {k: (v[offset:offset + numel].view(shapes[name]) if _is_elementwise(v, flat.numel()) else v)
                           for k, v in flat_state.items()}
            group_names.append(name)
            offset += numel
            start += 1
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": group_names})
    if start != len(names):
        raise ValueError(f"{folder / MODEL_STATES}: the flat fp32 groups hold {start} of the module's {len(names)} parameters")
    return weights, state, groups


# ------------------------------------------------------------------------------------- ZeRO-1/2

def _zero12_state(folder: Path, model_states: dict, shards: list[dict]):
    """Each parameter is its fragments (param_slice_mappings: start, numel in a rank's partition) in rank order."""
    shapes = model_states.get("param_shapes")
    if shapes is None or "param_slice_mappings" not in shards[0]:
        raise ValueError(f"{folder}: a ZeRO-1/2 checkpoint without 'param_shapes' / 'param_slice_mappings' (DeepSpeed "
                         "older than 0.10?); not a layout dsrecipes reads")
    weights = {k: v.float() if v.is_floating_point() else v for k, v in model_states["module"].items()}
    state, groups = {}, []
    base_groups = shards[0]["base_optimizer_state"]["param_groups"]
    for g, group_shapes in enumerate(shapes):
        pieces: dict[str, list[torch.Tensor]] = {n: [] for n in group_shapes}
        moments: dict[str, dict[str, list[torch.Tensor]]] = {n: {} for n in group_shapes}
        scalars: dict = {}
        for shard in shards:
            partition = shard["single_partition_of_fp32_groups"][g]
            group_state = shard["base_optimizer_state"]["state"].get(g, {})
            padded = partition.numel() + int((shard.get("group_paddings") or [0] * (g + 1))[g])  # the last rank's pad
            for name, address in shard["param_slice_mappings"][g].items():
                start, numel = int(address.start), int(address.numel)
                pieces[name].append(partition[start:start + numel])
                for key, value in group_state.items():
                    if _is_elementwise(value, padded) or _is_elementwise(value, partition.numel()):
                        moments[name].setdefault(key, []).append(value[start:start + numel])
            scalars = {k: v for k, v in group_state.items() if not isinstance(v, torch.Tensor) or v.dim() == 0}
        for name, shape in group_shapes.items():
            whole = torch.cat(pieces[name]) if pieces[name] else torch.empty(0)
            if whole.numel() != math.prod(shape):
                raise ValueError(f"{folder}: parameter {name!r} has {whole.numel()} elements in the partitions, "
                                 f"{math.prod(shape)} in param_shapes; the checkpoint is inconsistent")
            weights[name] = whole.view(shape).clone()
            state[name] = {**{k: torch.cat(v).view(shape).clone() for k, v in moments[name].items()}, **scalars}
        hyper = base_groups[g] if g < len(base_groups) else {}
        groups.append({**{k: v for k, v in hyper.items() if k != "params"}, "params": list(group_shapes)})
    _relink_shared(weights, state, model_states)
    return weights, state, groups


# ------------------------------------------------------------------------------------- ZeRO-3

def _zero3_state(folder: Path, model_states: dict, shards: list[dict], world: int):
    """Every rank holds ceil(numel / world) elements of each parameter, parameters back to back in param_shapes order."""
    shapes = model_states.get("param_shapes")
    if shapes is None:
        raise ValueError(f"{folder / ZERO3_MODEL_STATES.format(rank=0)}: no 'param_shapes'; not a ZeRO-3 layout dsrecipes reads")
    flats, flat_states, scalars = [], [], {}
    for shard in shards:
        flat = torch.cat([t.reshape(-1) for t in shard["fp32_flat_groups"]])
        states = shard["optimizer_state_dict"]["state"]
        keys = [k for k in (states.get(0) or {}) if _is_elementwise(states[0][k], shard["fp32_flat_groups"][0].numel())]
        flat_states.append({k: torch.cat([states[i][k].reshape(-1) for i in sorted(states)]) for k in keys})
        scalars = {k: v for k, v in (states.get(0) or {}).items() if k not in keys}
        flats.append(flat)
    weights = _buffers(model_states)
    state, groups, offset = {}, [], 0
    base_groups = shards[0]["optimizer_state_dict"]["param_groups"]
    for g, group_shapes in enumerate(shapes):
        for name, shape in group_shapes.items():
            numel = math.prod(shape)
            part = math.ceil(numel / world)
            if offset + part > flats[0].numel():
                raise ValueError(f"{folder}: the fp32 flat groups end before parameter {name!r}; the checkpoint is inconsistent")
            weights[name] = torch.cat([f[offset:offset + part] for f in flats])[:numel].view(shape).clone()
            state[name] = {**{k: torch.cat([s[k][offset:offset + part] for s in flat_states])[:numel].view(shape).clone()
                              for k in flat_states[0]}, **scalars}
            offset += part
        hyper = base_groups[g] if g < len(base_groups) else {}
        groups.append({**{k: v for k, v in hyper.items() if k != "params"}, "params": list(group_shapes)})
    frozen_shapes = model_states.get("frozen_param_shapes") or {}
    if frozen_shapes:
        fragments = [load_file(folder / ZERO3_MODEL_STATES.format(rank=r))["frozen_param_fragments"] for r in range(world)]
        for name, shape in frozen_shapes.items():
            weights[name] = torch.cat([f[name].reshape(-1) for f in fragments])[:math.prod(shape)].view(shape).float()
    _relink_shared(weights, state, model_states)
    return weights, state, groups


def _relink_shared(weights: dict, state: dict, model_states: dict) -> None:
    """Tied parameters DeepSpeed stored once: each alias gets its source's tensor."""
    for alias, source in (model_states.get("shared_params") or {}).items():
        if source in weights:
            weights[alias] = weights[source]
