"""float8 training of the linear layers through torchao's float8 (the `fp8` config group; CUDA GPUs only).

    python -m dsrecipes fp8=tensorwise precision=bf16                      # one GPU with compute capability >= 8.9
    python -m dsrecipes fp8=rowwise precision=bf16 launcher.nproc_per_node=8 zero.stage=3
    python -m dsrecipes fp8=tensorwise precision=bf16 zero.stage=3 launcher.nproc_per_node=8 \
        fp8.enable_fsdp_float8_all_gather=true fp8.precompute_float8_dynamic_scale_for_fsdp=true

What: every plain nn.Linear of the model is swapped for torchao's Float8Linear
(torchao.float8.convert_to_float8_training), whose matmuls (forward, grad-input and grad-weight) cast their
operands to float8 with dynamic scales and run torch._scaled_mm; the parameters stay what they were (fp32,
or bf16/fp16 under precision.master_weights), so the state dict, the optimizer and checkpoints are unchanged.
The recipes are torchao's `Float8LinearConfig.from_recipe_name` names: tensorwise (one scale per tensor; the
only one whose FSDP2 all-gather can be float8), rowwise (one scale per row, more accurate, slower) and
rowwise_with_gw_hp (rowwise, the weight gradient's matmul kept in high precision).

Kept in high precision (torchtitan's conventions): layers whose fully-qualified name contains one of
`fp8.filter_fqns` (default: the LM head, whose logits are sensitive), layers whose in/out features are not
multiples of 16 (torch._scaled_mm needs them), layers whose weight is tied to another module (a swap that
re-wraps the weight, as the FSDP float8 all-gather does, would untie it), the MoE router (dsrecipes keeps it in
fp32 on purpose) and nn.Linear subclasses (someone else's module; torchao would replace it with a plain one).

Where: dsrecipes.distributed.parallelize calls `apply_float8` after expert parallelism and before the
data-parallel strategy wraps the model (FSDP2's float8 all-gather needs the Float8Linear weights in place
before fully_shard) and before torch.compile (torchtitan's order; float8 is slower than bf16 without compile).
dsrecipes.config.validate calls `validate_float8_config` and `check_float8_compatibility` before any worker
starts. `float8_post_step` runs after each optimizer step (one all-reduce for all the float8 weights' scales
under FSDP2 with the float8 all-gather).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from dsrecipes.compression.config import compression_enabled
from dsrecipes.utils.compatibility_rows import Refusal, Supported
from dsrecipes.utils.config_enum import ConfigEnum, enum_values
from dsrecipes.utils.recipe_facts import RecipeFacts

# torch is imported in the functions that use it: the recipe schema imports Float8Config from here, and
# composing a recipe (`python -m dsrecipes --help`) must not import torch.
if TYPE_CHECKING:
    import torch
    from torch import nn


class Float8Recipe(ConfigEnum):
    """torchao's Float8LinearRecipeName values, plus none (no conversion)."""

    none = "none"
    tensorwise = "tensorwise"
    rowwise = "rowwise"
    rowwise_with_gw_hp = "rowwise_with_gw_hp"


FLOAT8_RECIPES = enum_values(Float8Recipe)
MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) or newer
DIVISOR = 16  # torch._scaled_mm needs both matmul dims of the weight to be multiples of 16


def _fp8_tp(root, dims):
    if root.fp8.enabled and dims.tp > 1:
        return (f"fp8={root.fp8.recipe} with parallel.tp={dims.tp} is not supported: tensor-parallel float8 needs "
                "torchao's Float8ColwiseParallel / Float8RowwiseParallel styles, which "
                "dsrecipes.distributed.tensor_parallel does not use; use parallel.tp=1 or fp8=none")
    return None


def _fp8_compression(root, dims):
    enabled = compression_enabled(root)
    if root.fp8.enabled and enabled:
        return (f"fp8={root.fp8.recipe} with compression.{enabled[0]}.enabled=true is not supported: compression "
                "quantizes and masks the same linear layers through hooks and module swaps that the Float8Linear "
                "swap would drop; use fp8=none for compression recipes")
    return None


@dataclass
class Float8Config:
    """Schema of the `fp8` group (conf/fp8/*.yaml); the keys are torchtitan's float8 keys."""

    # how the group composes with the layouts and the other groups (dsrecipes.config.compatibility)
    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("fp8 with tp", "tensor-parallel float8 needs torchao's float8 TP styles (not wired in yet)", _fp8_tp),
        Refusal("fp8 with compression", "compression's hooks and module swaps sit on the linears Float8Linear replaces",
                _fp8_compression),
    )

    recipe: Float8Recipe = Float8Recipe.none  # none | tensorwise | rowwise | rowwise_with_gw_hp
    # all-gather FSDP2's parameter shards in float8 instead of bf16 (half the bytes); tensorwise only,
    # needs the FSDP2 strategy (zero.stage=3, or 2 where dsrecipes picks FSDP2) with > 1 data-parallel rank
    enable_fsdp_float8_all_gather: bool = False
    # with the float8 all-gather: compute every float8 weight's scale in one all-reduce after the optimizer
    # step instead of one per layer in the next forward (torchao's precompute_float8_dynamic_scale_for_fsdp)
    precompute_float8_dynamic_scale_for_fsdp: bool = False
    # recompute the float8 weight in backward instead of saving it (torchao marks it deprecated since 0.12)
    force_recompute_fp8_weight_in_bwd: bool = False
    # linear layers whose fully-qualified name contains one of these stay in high precision
    filter_fqns: list[str] = field(default_factory=lambda: ["lm_head"])

    @property
    def enabled(self) -> bool:
        return str(self.recipe) != "none"

    CHECKED_BY_ENGINE: ClassVar[bool] = True  # dsrecipes.initialize checks it too (validate_engine_config)

    def check(self, facts: RecipeFacts) -> None:
        """The group's keys, the device (CUDA >= 8.9) and torchao, then fp8's keys against the layout."""
        validate_float8_config(self, facts.device)
        check_float8_compatibility(facts.root, facts.dims)


# ------------------------------------------------------------------------------------------ validation


def _torchao_problem() -> str | None:
    """Why torchao's float8 training cannot be used here (None: it can)."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: F401
    except ImportError as error:
        return (f"torchao is not installed ({error}); install it with pip install 'dsrecipes[fp8]' "
                "(or pip install torchao)")
    if not hasattr(Float8LinearConfig, "from_recipe_name"):
        import torchao

        return (f"torchao {getattr(torchao, '__version__', '?')} is too old (no Float8LinearConfig.from_recipe_name); "
                "pip install 'torchao>=0.10'")
    return None


def validate_float8_config(cfg: Float8Config, device_type: str | torch.device) -> None:
    """Refuse what cannot run, before any worker starts: the config's own consistency first (the same on every
    machine), then the device (CUDA, compute capability >= 8.9) and torchao being installed.

    device_type: the run's device ('cpu', 'cuda', 'cuda:1' or a torch.device; the recipe's trainer.device resolved).
    """
    recipe = str(cfg.recipe)
    if recipe not in FLOAT8_RECIPES:
        raise ValueError(f"fp8.recipe={recipe!r} is not valid; choose one of: {', '.join(FLOAT8_RECIPES)}")
    if not cfg.enabled:
        set_keys = [k for k in ("enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                                "force_recompute_fp8_weight_in_bwd") if getattr(cfg, k)]
        if set_keys:
            warnings.warn(f"fp8.{set_keys[0]}=true is ignored: fp8.recipe=none converts nothing "
                          "(choose fp8=tensorwise)", UserWarning, stacklevel=2)
        return
    if cfg.enable_fsdp_float8_all_gather and recipe != "tensorwise":
        raise ValueError(f"fp8.enable_fsdp_float8_all_gather=true needs fp8=tensorwise (one scale per weight tensor "
                         f"can be applied to each FSDP shard); got fp8.recipe={recipe}. Use fp8=tensorwise or set "
                         "fp8.enable_fsdp_float8_all_gather=false")
    if cfg.precompute_float8_dynamic_scale_for_fsdp and not cfg.enable_fsdp_float8_all_gather:
        raise ValueError("fp8.precompute_float8_dynamic_scale_for_fsdp=true precomputes the scales of the float8 "
                         "all-gather, so it needs fp8.enable_fsdp_float8_all_gather=true (got false)")
    empty = [f for f in cfg.filter_fqns if not str(f).strip()]
    if empty:
        raise ValueError(f"fp8.filter_fqns={list(cfg.filter_fqns)} holds an empty name, which every layer's name "
                         "contains (nothing would be converted); list name fragments such as lm_head")
    import torch

    device = torch.device(device_type)
    if device.type != "cuda":
        raise ValueError(f"fp8={recipe} needs a CUDA GPU with compute capability >= 8.9 (Ada/Hopper); this run's "
                         f"device is {device.type}; use fp8=none")
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise ValueError(f"fp8={recipe} needs a CUDA GPU with compute capability >= 8.9 (Ada/Hopper) for float8 "
                         f"matmuls; {device} is {name} with capability {capability[0]}.{capability[1]}; use fp8=none")
    problem = _torchao_problem()
    if problem:
        raise ValueError(f"fp8={recipe}: {problem}")


def check_float8_compatibility(root, dims) -> None:
    """fp8's own keys against the layout (ValueError), and combinations torchao runs untested (a warning).
    root: the RootConfig; dims: its ParallelDims. fp8 with whole groups (tp, compression) that cannot work is
    in the compatibility matrix (dsrecipes.config.compatibility)."""
    cfg = root.fp8
    if not cfg.enabled:
        return
    if cfg.enable_fsdp_float8_all_gather:
        from dsrecipes.distributed.data_parallel import choose_strategy

        strategy = choose_strategy(root.zero, dims, getattr(root.optimizer, "name", None))
        if strategy != "fsdp2":
            raise ValueError(f"fp8.enable_fsdp_float8_all_gather=true needs the FSDP2 strategy (zero.stage=3 with "
                             f"more than one data-parallel rank); this recipe uses {strategy} (zero.stage="
                             f"{root.zero.stage}, {dims.dp} data-parallel rank(s)). Set it false or use zero.stage=3")
        if getattr(root.zero, "zero_quantized_weights", False):
            raise ValueError("fp8.enable_fsdp_float8_all_gather=true with zero.zero_quantized_weights=true (qwZ): "
                             "both replace FSDP2's parameter all-gather; choose one")
    if root.precision.dtype == "fp16":
        warnings.warn(f"fp8={cfg.recipe} with precision.dtype=fp16: torchao's float8 recipes are validated with bf16 "
                      "(rowwise matmuls produce bf16 and are cast to fp16); prefer precision=bf16", UserWarning,
                      stacklevel=2)


# ------------------------------------------------------------------------------------------ conversion


def torchao_config(cfg: Float8Config):
    """torchao's Float8LinearConfig for `cfg`: the recipe's, with the FSDP / recompute options on top."""
    from torchao.float8 import Float8LinearConfig

    base = Float8LinearConfig.from_recipe_name(str(cfg.recipe))
    return dataclasses.replace(
        base,
        enable_fsdp_float8_all_gather=cfg.enable_fsdp_float8_all_gather,
        force_recompute_fp8_weight_in_bwd=cfg.force_recompute_fp8_weight_in_bwd,
    )


def _shared_parameter_ids(model: nn.Module) -> set[int]:
    """Parameters held by more than one module (tied embeddings)."""
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        seen[id(param)] = seen.get(id(param), 0) + 1
    return {pid for pid, count in seen.items() if count > 1}


def _router_fqns(model: nn.Module) -> set[str]:
    """FQNs of the linear layers inside dsrecipes MoE layers (router gate, residual coefficient): kept in fp32."""
    from torch import nn

    from dsrecipes.models.moe import MoELayer

    fqns: set[str] = set()
    for name, module in model.named_modules():
        if isinstance(module, MoELayer):
            for child_name, child in module.named_modules():
                if isinstance(child, nn.Linear) and child_name:
                    fqns.add(f"{name}.{child_name}" if name else child_name)
    return fqns


def skip_reason(module: nn.Module, fqn: str, cfg: Float8Config, shared: set[int], routers: set[str]) -> str | None:
    """Why the linear layer `fqn` stays in high precision (None: it is converted)."""
    from torch import nn

    if type(module) is not nn.Linear:
        return f"{type(module).__name__} is not a plain nn.Linear"
    matched = [f for f in cfg.filter_fqns if f in fqn]
    if matched:
        return f"fp8.filter_fqns ({matched[0]})"
    if module.in_features % DIVISOR or module.out_features % DIVISOR:
        return f"{module.in_features}x{module.out_features} not multiples of {DIVISOR}"
    if id(module.weight) in shared:
        return "weight tied to another module"
    if fqn in routers:
        return "MoE router (fp32)"
    return None


def apply_float8(model: nn.Module, cfg: Float8Config) -> list[str]:
    """Swap the model's eligible nn.Linear layers for torchao Float8Linear in place; returns the log lines.

    Parameters (and so state_dict keys, optimizer groups, checkpoints) are unchanged, except that with
    fp8.enable_fsdp_float8_all_gather the weights are re-wrapped in torchao's float8-aware tensor subclass.
    Call before the data-parallel strategy and torch.compile wrap the model.
    """
    if not cfg.enabled:
        return []
    from torchao.float8 import convert_to_float8_training

    shared, routers = _shared_parameter_ids(model), _router_fqns(model)
    skipped: dict[str, str] = {}
    converted: list[str] = []

    def module_filter_fn(module: nn.Module, fqn: str) -> bool:
        reason = skip_reason(module, fqn, cfg, shared, routers)
        if reason is None:
            converted.append(fqn)
        else:
            skipped[fqn] = reason
        return reason is None

    convert_to_float8_training(model, config=torchao_config(cfg), module_filter_fn=module_filter_fn)
    if not converted:
        warnings.warn(f"fp8={cfg.recipe} converted no linear layer of {type(model).__name__} (skipped: "
                      f"{_describe(skipped)}); the run trains in high precision", UserWarning, stacklevel=2)
    extras = [name for name, on in (("float8 FSDP all-gather", cfg.enable_fsdp_float8_all_gather),
                                    ("scales precomputed after each step", cfg.precompute_float8_dynamic_scale_for_fsdp),
                                    ("weight recomputed in backward", cfg.force_recompute_fp8_weight_in_bwd)) if on]
    line = f"fp8: {cfg.recipe}, {len(converted)} linear layer(s) converted"
    if extras:
        line += f" ({', '.join(extras)})"
    return [f"{line}, skipped: {_describe(skipped)}"]


def _describe(skipped: dict[str, str], limit: int = 6) -> str:
    if not skipped:
        return "none"
    items = [f"{fqn} ({reason})" for fqn, reason in skipped.items()]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def float8_linears(model: nn.Module) -> list[nn.Module]:
    """The model's torchao Float8Linear modules (empty when torchao is absent)."""
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        return []
    return [m for m in model.modules() if isinstance(m, Float8Linear)]


def float8_post_step_hooks(model: nn.Module, cfg: Float8Config) -> list[Callable[[], bool]]:
    """What the engine calls after each optimizer step for fp8 (the ParallelPlan carries them): the scale precompute
    when fp8.precompute_float8_dynamic_scale_for_fsdp is on. model: the module the data-parallel strategy wrapped."""
    return [functools.partial(float8_post_step, model, cfg)] if cfg.precompute_float8_dynamic_scale_for_fsdp else []


def float8_post_step(model: nn.Module, cfg: Float8Config) -> bool:
    """After optimizer.step(): precompute every float8 weight's dynamic scale in one all-reduce, when
    fp8.precompute_float8_dynamic_scale_for_fsdp is on and the model is FSDP2-sharded. Returns whether it ran."""
    if not (cfg.enabled and cfg.precompute_float8_dynamic_scale_for_fsdp):
        return False
    from torch.distributed.tensor import DTensor

    if not any(isinstance(m.weight, DTensor) for m in float8_linears(model)):
        return False  # not sharded by FSDP2: each forward computes its scales itself
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)
    return True


__all__ = ["FLOAT8_RECIPES", "Float8Config", "Float8Recipe", "apply_float8", "check_float8_compatibility",
           "float8_linears", "float8_post_step", "skip_reason", "torchao_config", "validate_float8_config"]
