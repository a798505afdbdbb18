"""Loading a Hugging Face checkpoint into a model built on the meta device: each rank keeps only what it holds.

    loader = checkpoint_loader(module, model_cfg)       # before parallelize; module's parameters are on meta
    plan = parallelize(module, ..., materialize=loader)  # it calls loader(module, device) where sharding allows

Why: `from_pretrained` on every rank puts a whole copy of the weights in every process before ZeRO-3 or tensor
parallelism shards them. Here the module is built with its parameters on the meta device, parallelize shards it
(tensor-parallel and FSDP2 DTensors, still on meta), and then `materialize`:
  1. gives every meta tensor real storage on the device (a rank's shard of a sharded parameter is all it gets),
     keeping the buffers the build computed (rotary frequencies) and recomputing dsrecipes' rotary tables;
  2. fills each parameter from the safetensors, one tensor at a time: of a parameter sharded by plain Shard
     placements (FSDP2's dim-0 shards, tp's splits) only this rank's region is read from the file (a safetensors
     slice: the other bytes are never paged in); any other tensor is read whole, upcast to float32 and cut with
     distribute_tensor(src_data_rank=None), which slices locally with no communication, the full tensor dropped
     before the next. Peak memory per rank: its shards plus the largest tensor read whole.
The values are bitwise those of the checkpoint (upcast to float32), i.e. what `from_pretrained(dtype=float32)`
gives, sharded. Strategies that need the whole model before wrapping (DDP, ZeRO-1/2, NVMe offload) get it
materialized and filled before the wrap (parallelize decides; DataParallelStrategy.wraps_meta_parameters).

Sources, by the module's parameter names:
* the transformers path (HFCausalLM): the checkpoint's own tensor names under the wrapper's `hf.` prefix, read
  straight from the safetensors; a checkpoint whose names transformers converts on load (the per-expert layout of
  Mixtral / Qwen3-MoE checkpoints, legacy names) is loaded through `from_pretrained` on each rank instead, said in
  the log (a full copy per rank while loading);
* the native path (dsrecipes' GPT): the checkpoint renamed and re-laid out by dsrecipes.models.hf_weights.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from dsrecipes.models.config import ModelConfig
from dsrecipes.models.hf_config import resolve_checkpoint_dir
from dsrecipes.peft.lora import is_lora_key

log = logging.getLogger("dsrecipes")

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
HF_PREFIX = "hf."  # HFCausalLM's name for the transformers module

Materialize = Callable[[nn.Module, torch.device], None]


# ------------------------------------------------------------------------------------------------ the files
def safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's safetensors files (one, or the shards its index names); [] when it has none."""
    if (directory / SAFETENSORS).is_file():
        return [directory / SAFETENSORS]
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise ValueError(f"{directory}: weight shard {missing[0]} named by {SAFETENSORS_INDEX} is missing")
        return [directory / n for n in names]
    return []


class SafetensorsReader:
    """Every tensor of a checkpoint's safetensors by name, read one at a time (headers read up front)."""

    def __init__(self, directory: Path):
        from safetensors import safe_open

        from dsrecipes.models.safetensors_regions import SafetensorsRegions

        self.directory = directory
        self._stack = contextlib.ExitStack()
        self._files, self._regions, self.shapes, self.dtypes = {}, {}, {}, {}
        for file in safetensors_files(directory):
            handle = self._stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
            regions = SafetensorsRegions(file)
            for name in handle.keys():
                part = handle.get_slice(name)
                self._files[name], self.shapes[name], self.dtypes[name] = handle, tuple(part.get_shape()), part.get_dtype()
                self._regions[name] = regions

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def names(self) -> set[str]:
        return set(self._files)

    def tensor(self, name: str) -> torch.Tensor:
        return self._files[name].get_tensor(name)

    def region(self, name: str, region: tuple[slice, ...]) -> torch.Tensor:
        """Only `region` of a tensor, read without mapping the file (dsrecipes.models.safetensors_regions): the rows
        outside it are never read, and nothing of the file stays resident in this process."""
        if any(r.stop <= r.start for r in region):  # an uneven split leaves some ranks nothing of this dimension
            return torch.empty([max(0, r.stop - r.start) for r in region])
        return self._regions[name].read(name, region)

    def close(self) -> None:
        self._stack.close()


# ------------------------------------------------------------------------------------------- materializing
def _shared_parameters(module: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """The (owner, name) places of each parameter held by more than one module (a tied embedding and LM head)."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for owner in module.modules():
        for name, param in owner._parameters.items():
            if param is not None:
                places.setdefault(id(param), []).append((owner, name))
    return [group for group in places.values() if len(group) > 1]


def materialize_empty(module: nn.Module, device: torch.device) -> None:
    """Real (uninitialised) storage on `device` for every meta tensor; the other tensors move to `device`. A
    parameter shared by two modules stays one parameter (Module._apply replaces a meta one per owner)."""
    shared = _shared_parameters(module)
    module._apply(lambda t: torch.empty_like(t, device=device) if t.is_meta else t.to(device))
    for (first, first_name), *others in shared:
        for owner, name in others:
            owner._parameters[name] = first._parameters[first_name]


def local_region(param: torch.Tensor) -> tuple[slice, ...] | None:
    """The part of the whole tensor this rank holds, for a DTensor laid out by plain Shard / Replicate placements
    (FSDP2's dim-0 shards, tensor parallelism's row and column splits, both); None for a plain tensor or any other
    placement (read whole, then cut by distribute_tensor)."""
    if not isinstance(param, DTensor) or any(type(p) not in (Shard, Replicate) for p in param.placements):
        return None
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(slice(start, start + size) for start, size in zip(offset, shape))


@torch.no_grad()
def fill_local(param: DTensor, part: torch.Tensor) -> None:
    """This rank's `part` (already cut to local_region) into the DTensor's local tensor."""
    local = param.to_local()
    local.copy_(part.to(device=local.device, dtype=local.dtype) if part.is_floating_point() else part.to(local.device))


@torch.no_grad()
def fill_parameter(param: torch.Tensor, full: torch.Tensor) -> None:
    """This rank's part of `full` (the whole parameter) into `param` (a DTensor shard, or a plain tensor)."""
    full = full.to(torch.float32) if full.dtype != param.dtype and full.is_floating_point() else full
    if isinstance(param, DTensor):
        param.copy_(distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None))
    else:
        param.copy_(full)


def fill_module(module: nn.Module, tensor_of: Callable[[str], torch.Tensor],
                region_of: Callable[[str, tuple[slice, ...]], torch.Tensor] | None = None) -> int:
    """Fill every parameter of `module` (a tied one once) from tensor_of(its name), or, where the parameter is a
    plainly sharded DTensor and region_of is given, from region_of(its name, local_region): only this rank's part is
    read. Returns how many elements this rank holds. LoRA adapters are left alone; a wrapped Linear's weights are
    read under their unwrapped names."""
    held = 0
    for name, param in module.named_parameters():
        if is_lora_key(name):  # LoRA adapters are not in a base checkpoint (dsrecipes.distributed.lora_adapters)
            continue
        name = name.replace(".base_layer.", ".")  # a wrapped Linear's own weight, under the checkpoint's name
        region = local_region(param) if region_of is not None else None
        if region is not None:
            fill_local(param, region_of(name, region))
        else:
            fill_parameter(param, tensor_of(name))
        held += (param.to_local() if isinstance(param, DTensor) else param).numel()
    return held


# ------------------------------------------------------------------------------------- the transformers path
def _ignored(patterns, name: str) -> bool:
    return any(re.search(p, name) for p in patterns or ())


def expected_names(hf_model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint of `hf_model` holds by name (its parameters and persistent buffers, a tied
    parameter under its first name) with their shapes."""
    names = {name: tuple(p.shape) for name, p in hf_model.named_parameters()}
    persistent = {name for name, _ in hf_model.named_buffers()} - {
        f"{prefix}{'.' if prefix else ''}{b}" for prefix, m in hf_model.named_modules()
        for b in getattr(m, "_non_persistent_buffers_set", ())}
    names.update({name: tuple(b.shape) for name, b in hf_model.named_buffers() if name in persistent})
    return names


def check_transformers_checkpoint(hf_model: nn.Module, directory: Path, source: str) -> bool:
    """Whether the checkpoint's tensors are the model's own names (True) or need transformers' conversion on load
    (False); ValueError naming a tensor whose shape differs, or a tensor the model has no place for."""
    reader = SafetensorsReader(directory)
    try:
        if not reader.names():
            raise ValueError(f"{source}: no safetensors weights ({SAFETENSORS} or {SAFETENSORS_INDEX}); save the "
                             "checkpoint with save_pretrained(DIR) (safetensors is its default)")
        expected = expected_names(hf_model)
        buffers = {name for name, _ in hf_model.named_buffers()}
        params = {n for n in expected if n not in buffers}
        if not params <= reader.names():
            missing = sorted(params - reader.names())
            unknown = sorted(reader.names() - set(expected))
            if not unknown:  # nothing to convert from: the tensors are missing
                raise ValueError(f"{source}: the checkpoint has no tensor {missing[0]!r} ({len(missing)} missing); is it "
                                 f"a complete {type(hf_model).__name__} checkpoint?")
            return False
        for name in sorted(reader.names() & set(expected)):
            if reader.shapes[name] != expected[name]:
                raise ValueError(f"{source}: tensor {name} has shape {reader.shapes[name]} in the checkpoint but "
                                 f"{expected[name]} in {type(hf_model).__name__} built from its config.json")
        extra = [n for n in sorted(reader.names() - set(expected))
                 if not _ignored(getattr(hf_model, "_keys_to_ignore_on_load_unexpected", None), n)]
        if extra:
            raise ValueError(f"{source}: {len(extra)} tensors of the checkpoint have no place in "
                             f"{type(hf_model).__name__} (e.g. {', '.join(extra[:3])}); its config.json does not "
                             "describe these weights")
        return True
    finally:
        reader.close()


def _transformers_loader(module: nn.Module, model_cfg: ModelConfig) -> Materialize:
    directory = resolve_checkpoint_dir(model_cfg.path)
    direct = check_transformers_checkpoint(module.hf, directory, str(model_cfg.path))

    def load(target: nn.Module, device: torch.device) -> None:
        materialize_empty(target, device)
        if direct:
            reader = SafetensorsReader(directory)
            try:
                held = fill_module(target, lambda name: reader.tensor(name.removeprefix(HF_PREFIX)),
                                   lambda name, region: reader.region(name.removeprefix(HF_PREFIX), region))
            finally:
                reader.close()
            log.info("model: %s elements of %s read from %s on this rank", f"{held:,}", model_cfg.name, directory)
            return
        log.info("model: %s's tensor names are converted by transformers on load (the per-expert layout of MoE "
                 "checkpoints): loading it with from_pretrained, a full copy on each rank while loading", directory)
        import transformers

        from dsrecipes.models.hf_module import hf_config_of

        full = transformers.AutoModelForCausalLM.from_pretrained(
            directory, config=hf_config_of(model_cfg), dtype=torch.float32,
            trust_remote_code=bool(model_cfg.trust_remote_code))
        state = full.state_dict()
        del full
        fill_module(target, lambda name: state[name.removeprefix(HF_PREFIX)])

    return load


# ------------------------------------------------------------------------------------------ the native path
def _native_loader(model_cfg: ModelConfig) -> Materialize:
    def load(target: nn.Module, device: torch.device) -> None:
        from dsrecipes.models.hf_import import read_hf_checkpoint

        _, state, _ = read_hf_checkpoint(model_cfg.path, model_cfg)  # dsrecipes names, float32
        materialize_empty(target, device)
        fill_module(target, state.__getitem__)
        del state
        base = getattr(target, "init_rope", None) or getattr(getattr(target, "module", None), "init_rope", None)
        if base is not None:
            base()

    return load


def checkpoint_loader(module: nn.Module, model_cfg: ModelConfig) -> Materialize:
    """What fills `module` (built on the meta device from model.path) with the checkpoint: loader(module, device)."""
    from dsrecipes.models.hf_module import HFCausalLM

    if isinstance(module, HFCausalLM):
        return _transformers_loader(module, model_cfg)
    return _native_loader(model_cfg)
