"""LoRA on plain PyTorch modules: wrap nn.Linear layers in place, train the adapters, fold them back.

    wrapped = apply_lora(model, PeftConfig(method="lora", r=8, alpha=16))   # every other parameter frozen
    ... train ...
    adapter = lora_state_dict(model)                   # lora_A / lora_B (+ the biases cfg.bias trains)
    merged = merged_state_dict(model)                  # the plain model's state dict, W + B @ A * alpha / r

Why here and not the `peft` package: dsrecipes shards, offloads and checkpoints its model by parameter name, so the
adapters must be ordinary submodules with predictable names. A LoRALinear keeps the original Linear as `base_layer`
(the very module, so tied weights stay tied) and names its adapters `lora_A` / `lora_B`: a wrapped model's state dict
reads `x.q_proj.base_layer.weight`, `x.q_proj.lora_A.weight`, `x.q_proj.lora_B.weight`, which is PEFT's layout
without its adapter name (dsrecipes.peft.peft_export writes PEFT's files from it).

Meta device: a LoRALinear over a meta Linear creates meta adapters; after `to_empty()` (and the model's own
initialisation, which knows nothing of adapters) call `init_lora(model, seed)` to give them LoRA's initialisation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from dsrecipes.peft.config import ALL_LINEAR, PeftConfig, names_explicitly, target_matches, validate_peft_config

LORA_KEYS = ("lora_A.weight", "lora_B.weight")
_WRAPPED_KEY = re.compile(r"^(?P<module>.+)\.(?:(?P<lora>lora_A\.weight|lora_B\.weight)|base_layer\.(?P<base>.+))$")


class LoRALinear(nn.Module):
    """base_layer(x) + lora_B(lora_A(dropout(x))) * scaling, with base_layer the original (frozen) nn.Linear.

    lora_A starts as kaiming_uniform_(a=sqrt(5)), lora_B as zeros (PEFT's default), so a fresh wrapper computes
    exactly what the Linear did. The adapters take the base weight's device and dtype.
    """

    def __init__(self, base_layer: nn.Linear, r: int, alpha: float, dropout: float = 0.0,
                 generator: torch.Generator | None = None):
        super().__init__()
        if not isinstance(base_layer, nn.Linear):
            raise ValueError(f"LoRALinear wraps an nn.Linear, not {type(base_layer).__name__}")
        self.base_layer = base_layer
        self.r, self.alpha = int(r), float(alpha)
        self.scaling = self.alpha / self.r
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        weight = base_layer.weight
        # skip_init: torch's default initialisation would draw from the global random stream, which the model's
        # own initialisation owns; reset_lora_parameters draws the values that count
        factory = {"device": weight.device, "dtype": weight.dtype, "bias": False}
        self.lora_A = nn.utils.skip_init(nn.Linear, base_layer.in_features, self.r, **factory)
        self.lora_B = nn.utils.skip_init(nn.Linear, self.r, base_layer.out_features, **factory)
        if not weight.is_meta:
            self.reset_lora_parameters(generator)

    @torch.no_grad()
    def reset_lora_parameters(self, generator: torch.Generator | None = None) -> None:
        """lora_A = kaiming_uniform_(a=sqrt(5)), lora_B = 0, in place. With a (CPU) generator the values are drawn
        on the CPU in float32 and copied in, so they do not depend on the device or the global random state. A
        sharded lora_A (a DTensor, after tensor parallelism or FSDP2) is drawn whole and each rank keeps its part,
        so it holds exactly the values an unsharded one gets."""
        a, b = self.lora_A.weight, self.lora_B.weight
        if a.is_meta:
            return
        if generator is None and not isinstance(a, DTensor):
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        else:
            draw = torch.empty(tuple(a.shape), dtype=torch.float32)
            nn.init.kaiming_uniform_(draw, a=math.sqrt(5), generator=generator)
            if isinstance(a, DTensor):
                draw = distribute_tensor(draw.to(a.device), a.device_mesh, a.placements, src_data_rank=None)
            a.copy_(draw)
        nn.init.zeros_(b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        if isinstance(x, DTensor):  # a replicated input under tensor parallelism (dsrecipes.distributed.lora_adapters):
            x = x.to_local()        # the adapters take it as the plain tensor each rank holds whole
        update = self.lora_B(self.lora_A(self.lora_dropout(x.to(self.lora_A.weight.dtype))))
        return result + (update * self.scaling).to(result.dtype)

    # what code reading a Linear's attributes expects (kernels, parameter-count helpers, exporters)
    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    @property
    def weight(self) -> nn.Parameter:
        return self.base_layer.weight

    @property
    def bias(self) -> nn.Parameter | None:
        return self.base_layer.bias

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha:g}, scaling={self.scaling:g}"


def _lm_heads(model: nn.Module) -> set[int]:
    """ids of the modules that are an LM head: a Hugging Face model's output embeddings, anything named lm_head,
    and a Linear whose weight is an embedding's (tied)."""
    heads: set[int] = set()
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for name, module in model.named_modules():
        get_output = getattr(module, "get_output_embeddings", None)
        if callable(get_output):
            try:
                head = get_output()
            except (AttributeError, NotImplementedError):
                head = None
            if isinstance(head, nn.Module):
                heads.add(id(head))
        if name.rsplit(".", 1)[-1] == "lm_head" or (
                isinstance(module, nn.Linear) and id(module.weight) in embedding_weights):
            heads.add(id(module))
    return heads


def _candidates(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """Every nn.Linear a LoRALinear may replace (not those nn.MultiheadAttention reads the weights of directly)."""
    found, skip = [], set()
    for name, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention):
            skip.update(id(m) for m in module.modules())
        elif isinstance(module, nn.Linear) and id(module) not in skip:
            found.append((name, module))
    return found


def _leaf_names(names: Iterable[str]) -> str:
    return ", ".join(dict.fromkeys(name.rsplit(".", 1)[-1] for name in names)) or "(none: the model has no nn.Linear)"


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, leaf, module)


def apply_lora(model: nn.Module, cfg: PeftConfig, prefix: str = "peft") -> list[str]:
    """Replace every nn.Linear that cfg.target_modules selects by a LoRALinear (in place) and freeze every other
    parameter (biases trainable as cfg.bias says); returns the qualified names of the wrapped Linears.

    Never an nn.Embedding; the LM head only where an entry names it (not through a regex or all-linear)."""
    validate_peft_config(cfg, prefix)
    if str(cfg.method) != "lora":  # not cfg.enabled: cfg may be an OmegaConf DictConfig of the schema
        raise ValueError(f"{prefix}.method={cfg.method!r} asks for no adapters; set {prefix}.method=lora to apply LoRA")
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise ValueError(f"the model already carries LoRA adapters; apply {prefix} (LoRA) to a model once")
    targets = [str(entry) for entry in cfg.target_modules]
    heads = _lm_heads(model)
    candidates = _candidates(model)
    chosen = []
    for name, linear in candidates:
        if id(linear) in heads:
            selected = any(names_explicitly(name, entry) for entry in targets)
        else:
            selected = any(entry == ALL_LINEAR or target_matches(name, entry) for entry in targets)
        if selected:
            chosen.append((name, linear))
    if not chosen:
        raise ValueError(f"{prefix}.target_modules={targets} matched no nn.Linear of the model; its Linear names end "
                         f"in: {_leaf_names(name for name, _ in candidates)} (an LM head is adapted only when an "
                         "entry names it)")
    generator = torch.Generator().manual_seed(int(cfg.init_seed)) if cfg.init_seed is not None else None
    for name, linear in chosen:
        _set_submodule(model, name, LoRALinear(linear, cfg.r, cfg.alpha, cfg.dropout, generator))
    _freeze_all_but_lora(model, cfg.bias)
    return [name for name, _ in chosen]


def _freeze_all_but_lora(model: nn.Module, bias: str) -> None:
    for param in model.parameters():
        param.requires_grad_(False)
    for module in model.modules():
        if isinstance(module, LoRALinear):
            module.lora_A.weight.requires_grad_(True)
            module.lora_B.weight.requires_grad_(True)
            if bias == "lora_only" and module.base_layer.bias is not None:
                module.base_layer.bias.requires_grad_(True)
    if bias == "all":
        for name, param in model.named_parameters():
            if name.rsplit(".", 1)[-1] == "bias":
                param.requires_grad_(True)


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """The model's LoRALinear modules by qualified name."""
    return {name: module for name, module in model.named_modules() if isinstance(module, LoRALinear)}


def init_lora(model: nn.Module, init_seed: int | None = None) -> None:
    """(Re)initialise every adapter in place (after `to_empty()` and the model's own init_weights, which would
    otherwise leave lora_B non-zero): the values apply_lora gives with the same init_seed."""
    generator = torch.Generator().manual_seed(int(init_seed)) if init_seed is not None else None
    for module in lora_modules(model).values():
        module.reset_lora_parameters(generator)


def is_lora_key(name: str) -> bool:
    """Whether a state-dict key is an adapter tensor (x.lora_A.weight / x.lora_B.weight)."""
    return name.endswith(tuple("." + key for key in LORA_KEYS))


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors and the trainable biases (those cfg.bias trains), named as in model.state_dict()."""
    trainable = {name for name, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
    return {name: tensor for name, tensor in model.state_dict().items()
            if is_lora_key(name) or (name in trainable and name.rsplit(".", 1)[-1] == "bias")}


def lora_state_dict_of(state: Mapping[str, torch.Tensor], bias: str = "none") -> dict[str, torch.Tensor]:
    """lora_state_dict from a full state dict (one gathered from a sharded model): the adapter tensors and the
    biases peft.bias trains (all: every bias; lora_only: the wrapped Linears' `base_layer.bias`)."""
    def kept(name: str) -> bool:
        if is_lora_key(name):
            return True
        if str(bias) == "all":
            return name.endswith(".bias")
        return str(bias) == "lora_only" and name.endswith(".base_layer.bias")

    return {name: tensor for name, tensor in state.items() if kept(name)}


def merge_lora_state(state: Mapping[str, torch.Tensor], scaling: float | Mapping[str, float]) -> dict:
    """A wrapped model's full state dict (model.state_dict(), or one gathered from a sharded model) with every
    adapter folded in: `m.weight = m.base_layer.weight + (m.lora_B.weight @ m.lora_A.weight) * scaling` (in float32,
    cast back to the weight's dtype), `m.base_layer.bias` as `m.bias`, no lora_* keys; other keys unchanged, in order.

    scaling: alpha / r, or a map from each wrapped module's name to its own."""
    modules = {key[: -len(".lora_A.weight")] for key in state if key.endswith(".lora_A.weight")}
    merged: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        match = _WRAPPED_KEY.match(key)
        module = match["module"] if match else None
        if module not in modules:
            merged[key] = tensor
        elif match["base"] == "weight":
            merged[f"{module}.weight"] = _fold(state, module, _scaling_of(scaling, module))
        elif match["base"] is not None:
            merged[f"{module}.{match['base']}"] = tensor
    return merged


def _scaling_of(scaling: float | Mapping[str, float], module: str) -> float:
    if isinstance(scaling, Mapping):
        if module not in scaling:
            raise ValueError(f"merge_lora_state: no scaling given for the adapted module {module!r}")
        return float(scaling[module])
    return float(scaling)


def _fold(state: Mapping[str, torch.Tensor], module: str, scaling: float) -> torch.Tensor:
    for part in ("base_layer.weight", "lora_B.weight"):
        if f"{module}.{part}" not in state:
            raise ValueError(f"merge_lora_state: the state has {module}.lora_A.weight but no {module}.{part}")
    weight = state[f"{module}.base_layer.weight"]
    a, b = state[f"{module}.lora_A.weight"], state[f"{module}.lora_B.weight"]
    update = b.detach().to(weight.device, torch.float32) @ a.detach().to(weight.device, torch.float32)
    return (weight.detach().float() + update * scaling).to(weight.dtype)


def merged_state_dict(model_or_state: nn.Module | Mapping[str, torch.Tensor],
                      scaling: float | Mapping[str, float] | None = None) -> dict:
    """merge_lora_state of a model (each adapter's own scaling unless `scaling` is given) or of a state dict
    (`scaling` required): the state dict of the model without adapters."""
    if isinstance(model_or_state, nn.Module):
        if scaling is None:
            scaling = {name: module.scaling for name, module in lora_modules(model_or_state).items()}
        return merge_lora_state(model_or_state.state_dict(), scaling)
    if scaling is None:
        raise ValueError("merged_state_dict of a state dict needs scaling (peft.alpha / peft.r)")
    return merge_lora_state(model_or_state, scaling)


def strip_base_layer_names(state: Mapping[str, torch.Tensor]) -> dict:
    """`a.q_proj.base_layer.weight` -> `a.q_proj.weight` (the base model's names); other keys (lora_* included)
    unchanged."""
    return {key.replace(".base_layer.", ".", 1) if ".base_layer." in key else key: tensor
            for key, tensor in state.items()}


def add_base_layer_names(state: Mapping[str, torch.Tensor], wrapped: Iterable[str]) -> dict:
    """A base checkpoint's names on a wrapped model: `m.weight` / `m.bias` -> `m.base_layer.weight` / `.bias` for
    each wrapped module m (apply_lora's return); load with strict=False, the adapters being missing."""
    renames = {}
    for module in wrapped:
        for part in ("weight", "bias"):
            renames[f"{module}.{part}"] = f"{module}.base_layer.{part}"
    return {renames.get(key, key): tensor for key, tensor in state.items()}


def count_trainable(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts, a tied weight counted once."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
