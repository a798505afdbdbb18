"""Optimizer construction: DeepSpeed's optimizer names on torch's classes, parameter groups and kernels.

What: `build_optimizer(cfg, model)` turns an optimizer option's config (AdamWConfig, SGDConfig, ...
in dsrecipes.training.config) into a `torch.optim.Optimizer` over the model's trainable
parameters, split into a decayed group (matrices) and an undecayed group (biases, norm weights and
other 1-D parameters) when `no_decay_bias_and_norm` is set.

The caller's own parameter groups (DeepSpeed's `model_parameters`, `dsrecipes.initialize(...,
model_parameters=...)`): `named_param_groups(model_parameters, model)` records them by parameter
name before anything wraps the model, `resolve_param_groups(named, module, cfg)` finds those names
in the module the optimizer steps (FSDP2's sharded parameters, fp32 masters ...), and
`build_optimizer(cfg, module, groups)` builds the configured class over them. A group keeps its
own options (lr, weight_decay, betas ...); the option's values fill the keys it does not set. A
group that sets no weight_decay gets optimizer.weight_decay and, with no_decay_bias_and_norm, its
biases / norm weights / 1-D parameters move to a companion group right after it with weight_decay
0 (so `model_parameters=model.parameters()` builds exactly the default groups); a group that sets
weight_decay is taken as it is. Frozen parameters are left out, as in the default groups.

Each option names its class in `_target_` and its constructor arguments as flat keys, built with
`_partial_` through dsrecipes.utils.instantiate (the parameters are the runtime argument):

    adamw    torch.optim.AdamW
    adam     `adam` below: torch.optim.AdamW while adam_w_mode is true (DeepSpeed's default:
             "Adam" decouples weight decay), torch.optim.Adam (L2 weight decay) when it is false
    sgd      torch.optim.SGD (momentum, nesterov)
    adagrad  torch.optim.Adagrad (lr_decay, eps)
    lamb     dsrecipes.training.optim.lamb.Lamb (FusedLamb's update and trust-ratio clamp)
    onebitadam / zerooneadam / onebitlamb   DeepSpeed's 1-bit optimizers (dsrecipes.training.optim.onebit_adam,
             zero_one_adam, onebit_lamb), run by the `onebit` data-parallel strategy
    lion     dsrecipes.training.optim.lion.Lion
    muon     dsrecipes.training.optim.muon.Muon (Muon for the hidden matrices, Adam for the rest: the option's
             `regroup` splits each decay group by parameter name, dsrecipes.training.optim.muon_params)
    rmsprop  torch.optim.RMSprop
    custom   any class by import path (optimizer._target_=torch.optim.NAdam), its arguments flat,
             much like DeepSpeed's fallback to `getattr(torch.optim, type)`

The engine's own keys (name, impl, no_decay_bias_and_norm) never reach the class; weight_decay is
set per parameter group and passed to the class when it takes the argument. Every other key must
be an argument of the class: validation checks them against its signature before any work starts.

Why torch's own kernels: instead of DeepSpeed's hand-written CUDA optimizers, `impl` selects the
fused / foreach / for-loop implementations torch already has. `auto` picks fused when every
parameter is on CUDA and the class has a working fused kernel for them, else foreach.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dsrecipes.training.config import check_option
from dsrecipes.training.optim.optimizer_config import OPTIMIZER_SCHEMAS, OptimizerConfig, OptimizerImpl
from dsrecipes.training.option_schemas import config_items
from dsrecipes.utils.instantiate import instantiate

__all__ = [
    "OPTIMIZERS",
    "OPTIMIZER_IMPLS",
    "adam",
    "build_optimizer",
    "named_param_groups",
    "optimizer_class",
    "param_groups",
    "resolve_param_groups",
    "supported_impls",
    "validate_optimizer_config",
]

OPTIMIZERS = tuple(OPTIMIZER_SCHEMAS)
OPTIMIZER_IMPLS = tuple(impl.value for impl in OptimizerImpl)

# Read by the engine itself, never passed to the class. weight_decay is the engine's too (it is set
# per parameter group) and reaches the class only when the class takes it (_constructor_arguments).
_ENGINE_KEYS = ("name", "_target_", "impl", "no_decay_bias_and_norm", "state_dtype")
# Arguments the engine sets: a config key must not name them.
_RESERVED_ARGUMENTS = {
    "params": "the model's parameters are passed by the engine",
    "fused": "choose the kernel with optimizer.impl (auto | fused | foreach | for_loop)",
    "foreach": "choose the kernel with optimizer.impl (auto | fused | foreach | for_loop)",
}


class AdamFactory:
    """The `_target_` of optimizer=adam: DeepSpeed's "Adam", whose adam_w_mode picks the class.

    adam_w_mode true (DeepSpeed's default) builds torch.optim.AdamW, decoupled weight decay;
    false builds torch.optim.Adam, weight decay added to the gradient (L2). A callable object
    rather than a function so that `optimizer_class` can ask which class it builds.
    """

    def __call__(self, params: Any, adam_w_mode: bool = True, **kwargs: Any) -> torch.optim.Optimizer:
        """The optimizer: optimizer_class(adam_w_mode)(params, **kwargs)."""
        return self.optimizer_class(adam_w_mode)(params, **kwargs)

    @staticmethod
    def optimizer_class(adam_w_mode: bool = True, **_: Any) -> type[torch.optim.Optimizer]:
        """AdamW while adam_w_mode, else Adam (the other arguments do not matter)."""
        return torch.optim.AdamW if adam_w_mode else torch.optim.Adam


adam = AdamFactory()


def param_groups(model: nn.Module, weight_decay: float, no_decay_bias_and_norm: bool) -> list[dict]:
    """Two groups: decayed matrices, and undecayed biases / norm weights / other 1-D parameters.

    Parameters that do not require grad are left out and shared (tied) parameters appear once.
    Empty groups are dropped, so a model of only 1-D parameters gets a single group.
    """
    decay, no_decay, seen = [], [], set()
    for _, param in model.named_parameters():
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        (no_decay if no_decay_bias_and_norm and param.ndim < 2 else decay).append(param)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def _group_list(model_parameters: Any) -> list[dict]:
    """model_parameters as a list of group dicts: an iterable of tensors is one group without options."""
    if isinstance(model_parameters, (torch.Tensor, dict)):
        model_parameters = [model_parameters]
    items = list(model_parameters)
    if not items:
        raise ValueError("model_parameters is empty: pass the parameters (or param-group dicts) to optimize")
    if all(isinstance(item, dict) for item in items):
        return items
    if all(isinstance(item, torch.Tensor) for item in items):
        return [{"params": items}]
    kinds = sorted({type(item).__name__ for item in items})
    raise ValueError(f"model_parameters must be an iterable of parameters or of param-group dicts (each with "
                     f"'params'), not a mix; got {', '.join(kinds)}")


def named_param_groups(model_parameters: Any, model: nn.Module) -> list[dict]:
    """The caller's parameter groups with each parameter replaced by its name in `model`.

    Taken before anything wraps the model, so the groups survive mechanisms that replace parameter
    objects (FSDP2's fully_shard, tensor parallelism, kernel injection). Raises ValueError naming
    the group for an entry without 'params', a tensor that is not a parameter of `model`, or a
    parameter given twice. Parameters that do not require grad are left out.
    """
    names: dict[int, str] = {}
    for name, param in model.named_parameters():  # a tied parameter once, under its first name
        names.setdefault(id(param), name)
    seen: dict[str, int] = {}
    groups = []
    for index, group in enumerate(_group_list(model_parameters)):
        if "params" not in group:
            raise ValueError(f"model_parameters[{index}] has no 'params' (keys: {', '.join(map(str, group))})")
        params = group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        named = []
        for param in params:
            name = names.get(id(param)) if isinstance(param, torch.Tensor) else None
            if name is None:
                what = f"a tensor of shape {tuple(param.shape)}" if isinstance(param, torch.Tensor) else type(param).__name__
                raise ValueError(f"model_parameters[{index}] holds {what} that is not a parameter of "
                                 f"{type(model).__name__} (pass the model's own parameters)")
            if name in seen:
                raise ValueError(f"parameter {name!r} is in model_parameters[{seen[name]}] and model_parameters[{index}]; "
                                 "each parameter may be in one group only")
            seen[name] = index
            if param.requires_grad:
                named.append(name)
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": named})
    return groups


def resolve_param_groups(named_groups: list[dict], module: nn.Module, cfg: OptimizerConfig,
                         allow_missing: bool = False) -> list[dict]:
    """Groups of `module`'s parameters (the tree the optimizer steps) from named_param_groups' names.

    A group without weight_decay gets cfg.weight_decay, its 1-D parameters split off with weight
    decay 0 when cfg.no_decay_bias_and_norm (the companion group follows it, with its other
    options). allow_missing: names this rank does not hold (another pipeline stage's, another
    rank's experts) are left out; otherwise a missing name is an error. Empty groups are dropped.
    """
    by_name = dict(module.named_parameters())
    groups = []
    for group in named_groups:
        options = {k: v for k, v in group.items() if k != "params"}
        missing = [name for name in group["params"] if name not in by_name]
        if missing and not allow_missing:
            raise RuntimeError(f"parameter {missing[0]!r} of model_parameters is not in the module the optimizer "
                               f"steps ({type(module).__name__}); a wrapping step renamed it")
        params = [by_name[name] for name in group["params"] if name in by_name]
        if "weight_decay" in options:
            split = [(params, options)]
        else:
            off = [p for p in params if cfg.no_decay_bias_and_norm and p.ndim < 2]
            on = [p for p in params if not (cfg.no_decay_bias_and_norm and p.ndim < 2)]
            split = [(on, {**options, "weight_decay": cfg.weight_decay}), (off, {**options, "weight_decay": 0.0})]
        groups.extend({**opts, "params": members} for members, opts in split if members)
    return groups


# --------------------------------------------------------------------------------------------
# The class and its arguments
# --------------------------------------------------------------------------------------------


def _class_arguments(cfg: OptimizerConfig) -> dict[str, Any]:
    """The config's keys that go to the class whatever it is: all but the engine's and weight_decay."""
    engine = (*_ENGINE_KEYS, *type(cfg).GROUPING_KEYS, "weight_decay")
    return {key: value for key, value in config_items(cfg).items() if key not in engine}


def _call(target: functools.partial, *args: Any, **kwargs: Any) -> Any:
    """target(*args, **kwargs) with its list arguments as tuples.

    torch.optim declares betas / etas / step_sizes as tuples, and some classes keep what they are
    given in param_groups; Hydra hands lists (call-time keywords override the partial's).
    """
    tuples = {key: tuple(value) for key, value in target.keywords.items() if isinstance(value, list)}
    return target(*args, **tuples, **kwargs)


def _target(cfg: OptimizerConfig, arguments: dict[str, Any], prefix: str) -> functools.partial:
    """partial(_target_, **arguments), through dsrecipes.utils.instantiate; call it with the param groups."""
    return instantiate({"_target_": cfg._target_, "_partial_": True, **arguments}, prefix)


def _built_class(target: functools.partial) -> Callable[..., Any]:
    """The class a partial builds: its callable, or the class a factory (see AdamFactory) says it builds."""
    resolve = getattr(target.func, "optimizer_class", None)
    return resolve(**target.keywords) if callable(resolve) else target.func


def _target_and_class(cfg: OptimizerConfig, prefix: str) -> tuple[functools.partial, Callable[..., Any]]:
    """(partial of _target_ with the class arguments, the class it builds)."""
    target = _target(cfg, _class_arguments(cfg), prefix)
    return target, _built_class(target)


def optimizer_class(cfg: OptimizerConfig, prefix: str = "optimizer") -> Callable[..., torch.optim.Optimizer]:
    """The class `cfg` builds: its `_target_`, or for a factory target (adam) the class it picks."""
    return _target_and_class(cfg, prefix)[1]


def _constructor_arguments(cfg: OptimizerConfig, cls: Callable[..., Any]) -> dict[str, Any]:
    """Everything the class gets besides the parameters and impl: weight_decay too when it takes it."""
    arguments = _class_arguments(cfg)
    if "weight_decay" in _signature_parameters(cls):
        arguments["weight_decay"] = cfg.weight_decay
    return arguments


def _signature_parameters(fn: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """fn's parameters by name (empty when it has no introspectable signature)."""
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def _accepted_arguments(target: Callable[..., Any], cls: Callable[..., Any]) -> tuple[list[str], bool]:
    """(the keyword arguments target(params, ...) takes, whether it takes any keyword at all).

    A factory that forwards **kwargs to the class it builds (adam) takes its own named arguments
    plus that class's. No introspectable signature counts as taking anything.
    """
    names: list[str] = []
    takes_any = False
    for fn in [target] if cls is target else [target, cls]:
        params = _signature_parameters(fn)
        if not params:
            return names, True
        names += [n for n, p in params.items()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n != "params" and n not in names]
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        if not takes_any:
            break
    return names, takes_any


def supported_impls(cls: Callable[..., Any]) -> tuple[str, ...]:
    """The `impl` values `cls` accepts: auto always; fused / foreach / for_loop by its signature."""
    params = _signature_parameters(cls)
    impls = ["auto"]
    if "fused" in params:
        impls.append("fused")
    if "foreach" in params:
        impls.extend(["foreach", "for_loop"])
    return tuple(impls)


def _display_name(cfg: OptimizerConfig) -> str:
    """How messages name the optimizer: the option's name, or `_target_` when it is not the option's own."""
    own = type(cfg).__dataclass_fields__["_target_"].default
    return cfg.name if cfg._target_ == own else cfg._target_


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _check_reserved(cfg: OptimizerConfig, prefix: str) -> None:
    """ValueError for a key naming an argument the engine sets, or one of Hydra's reserved `_x_` keys."""
    for key in config_items(cfg):
        if key in _RESERVED_ARGUMENTS:
            raise ValueError(f"{prefix}.{key} is not allowed: {_RESERVED_ARGUMENTS[key]}")
        if key.startswith("_") and key != "_target_":
            raise ValueError(f"{prefix}.{key} is not allowed: keys starting with '_' are Hydra's")


def _check_arguments(cfg: OptimizerConfig, target: functools.partial, cls: Callable[..., Any], prefix: str) -> None:
    """ValueError unless the class takes every key given to it (the typo check for `custom`)."""
    if isinstance(cls, type) and not issubclass(cls, torch.optim.Optimizer):
        raise ValueError(f"{prefix}._target_={cfg._target_!r} is not a torch.optim.Optimizer class")
    names, takes_any = _accepted_arguments(target.func, cls)
    where = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else cfg._target_
    for key in target.keywords:
        if not takes_any and key not in names:
            settable = [n for n in names if n not in _RESERVED_ARGUMENTS]
            raise ValueError(f"{prefix}.{key} is not an argument of {where} ({prefix}._target_); "
                             f"it takes: {', '.join(settable)}")
    if cfg.weight_decay and "weight_decay" not in _signature_parameters(cls) and not takes_any:
        raise ValueError(f"{prefix}.weight_decay={cfg.weight_decay} but {where} has no weight_decay argument; "
                         f"set {prefix}.weight_decay=0")
    try:
        inspect.signature(target.func).bind(None, **_constructor_arguments(cfg, cls))
    except TypeError as err:
        raise ValueError(f"{prefix}: {where} cannot be built from these keys: {err}") from err
    except ValueError:  # no introspectable signature: construction will tell
        pass


def _check_impl_supported(cfg: OptimizerConfig, cls: Callable[..., Any], prefix: str) -> None:
    """ValueError when `cfg.impl` is not one `cls` can run, naming the choices it has."""
    if cfg.impl not in OPTIMIZER_IMPLS:
        raise ValueError(f"{prefix}.impl={cfg.impl!r} is not valid; choose one of: {', '.join(OPTIMIZER_IMPLS)}")
    impls = supported_impls(cls)
    if cfg.impl not in impls:
        raise ValueError(
            f"{prefix}.impl={cfg.impl!r} is not supported by {_display_name(cfg)}; choose one of: {', '.join(impls)}"
        )


def _check_values(cfg: OptimizerConfig, prefix: str) -> None:
    """The hyperparameters' ranges, for whichever of them the option has."""
    items = config_items(cfg)
    if not items["lr"] > 0:
        raise ValueError(f"{prefix}.lr={items['lr']} must be > 0")
    if "betas" in items:
        betas = list(items["betas"])
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"{prefix}.betas={betas} must be two values in [0, 1)")
    for key in ("weight_decay", "eps", "momentum", "lr_decay"):
        if key in items and items[key] < 0:
            raise ValueError(f"{prefix}.{key}={items[key]} must be >= 0")
    if items.get("nesterov") and items.get("momentum", 0) <= 0:
        raise ValueError(f"{prefix}.nesterov=true needs {prefix}.momentum > 0 (got momentum={items.get('momentum')})")
    if "min_coeff" in items and not 0 <= items["min_coeff"] <= items["max_coeff"]:
        raise ValueError(
            f"{prefix}.min_coeff={items['min_coeff']} and {prefix}.max_coeff={items['max_coeff']}: "
            "need 0 <= min_coeff <= max_coeff"
        )
    _check_onebit_values(items, prefix)


# the 1-bit optimizers' step counts and their least valid value (freeze_step: at least one warm-up update)
_ONEBIT_STEPS = {"freeze_step": 1, "var_freeze_step": 0, "var_update_scaler": 1, "local_step_scaler": 1,
                 "local_step_clipper": 1}


def _check_onebit_values(items: dict[str, Any], prefix: str) -> None:
    """onebitadam / zerooneadam / onebitlamb: integer step keys, LAMB's factor bounds and coeff_beta."""
    for key, minimum in _ONEBIT_STEPS.items():
        value = items.get(key)
        if key in items and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
            why = " (the variance freezes at the end of the uncompressed warm-up, which needs a step)" \
                if key == "freeze_step" else ""
            raise ValueError(f"{prefix}.{key}={value!r} must be an integer >= {minimum}{why}")
    if "factor_min" in items and not 0 < items["factor_min"] <= items["factor_max"]:
        raise ValueError(f"{prefix}.factor_min={items['factor_min']} and {prefix}.factor_max={items['factor_max']}: "
                         "need 0 < factor_min <= factor_max")
    if "factor_threshold" in items and not 0 <= items["factor_threshold"] < 1:
        raise ValueError(f"{prefix}.factor_threshold={items['factor_threshold']} must be in [0, 1)")
    if "coeff_beta" in items and not 0 <= items["coeff_beta"] < 1:
        raise ValueError(f"{prefix}.coeff_beta={items['coeff_beta']} must be in [0, 1)")


def validate_optimizer_config(cfg: OptimizerConfig, prefix: str = "optimizer") -> None:
    """Raise ValueError (naming key, value and what is valid) on a config no optimizer can be built from.

    Checks that cfg is an option's schema with its own name and keys, that `_target_` imports and
    takes every key (the class's signature: what catches a typo in a `custom` option), impl (in
    general and for this class), lr > 0, betas = two values in [0, 1), non-negative weight_decay /
    eps / momentum / lr_decay, nesterov only with momentum, 0 <= min_coeff <= max_coeff.
    """
    check_option(cfg, "optimizer", prefix)
    _check_reserved(cfg, prefix)
    target, cls = _target_and_class(cfg, prefix)
    _check_arguments(cfg, target, cls, prefix)
    _check_impl_supported(cfg, cls, prefix)
    _check_values(cfg, prefix)
    _check_state_dtype(cfg, cls, prefix)


# the classes optimizer.state_dtype=bf16 replaces by CompactAdam, and whether their weight decay is decoupled
_COMPACT_STATE = {torch.optim.AdamW: True, torch.optim.Adam: False}


def _check_state_dtype(cfg: OptimizerConfig, cls: Callable[..., Any], prefix: str) -> None:
    """ValueError for bf16 state with a class whose state CompactAdam does not hold (or amsgrad's extra maximum)."""
    dtype = str(cfg.state_dtype)
    if dtype == "fp32":
        return
    items = config_items(cfg)
    if cls not in _COMPACT_STATE:
        stateless = cfg.name == "sgd" and not items.get("momentum")
        why = (f"optimizer={cfg.name} with momentum 0 has no state to store" if stateless
               else f"it is implemented for the Adam family (optimizer=adamw, adam), not {_display_name(cfg)}")
        raise ValueError(f"{prefix}.state_dtype={dtype}: {why}; use {prefix}.state_dtype=fp32")
    if str(cfg.impl) in ("fused", "foreach"):
        raise ValueError(f"{prefix}.state_dtype={dtype} with {prefix}.impl={cfg.impl}: the bf16-state Adam steps one "
                         f"parameter at a time; use {prefix}.impl=auto or for_loop")
    if items.get("amsgrad"):
        raise ValueError(f"{prefix}.state_dtype={dtype} with {prefix}.amsgrad=true: AMSGrad's running maximum is not "
                         "kept in bf16; set amsgrad false or state_dtype fp32")


# --------------------------------------------------------------------------------------------
# Construction
# --------------------------------------------------------------------------------------------


def _fused_works(target: Callable[..., Any], params: list[torch.Tensor]) -> tuple[bool, str]:
    """Whether `target(..., fused=True)` can step tensors of every (device, dtype) in `params`.

    Fused kernels exist per device and dtype (e.g. torch's fused Adagrad is CPU-only), and some
    classes only find out at the first step, so this steps a throwaway one-element probe of each kind.
    Returns (ok, reason).
    """
    for device, dtype in {(p.device, p.dtype) for p in params}:
        probe = torch.zeros(1, device=device, dtype=dtype, requires_grad=True)
        probe.grad = torch.zeros_like(probe)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _call(target, [probe], fused=True).step()
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
            return False, f"{device.type} {str(dtype).replace('torch.', '')} parameters: {exc}"
    return True, ""


def _impl_kwargs(cfg: OptimizerConfig, cls: Callable[..., Any], target: Callable[..., Any],
                 params: list[torch.Tensor]) -> dict:
    """The fused= / foreach= arguments that select `cfg.impl` for `cls` (empty when it has neither)."""
    impls = supported_impls(cls)
    if cfg.impl == "auto":
        on_cuda = bool(params) and all(p.is_cuda for p in params)
        if "fused" in impls and on_cuda and _fused_works(target, params)[0]:
            return {"fused": True}
        return {"foreach": True} if "foreach" in impls else {}
    if cfg.impl == "fused":
        ok, reason = _fused_works(target, params)
        if not ok:
            raise ValueError(
                f"optimizer.impl='fused' is not available for {_display_name(cfg)} on {reason}; "
                "choose auto, foreach or for_loop"
            )
        return {"fused": True}
    return {"foreach": cfg.impl == "foreach"}


def build_optimizer(cfg: OptimizerConfig, model: nn.Module, groups: list[dict] | None = None) -> torch.optim.Optimizer:
    """The configured optimizer over `model`'s trainable parameters, or over `groups`.

    Validates `cfg` first (see validate_optimizer_config). Weight decay is set per parameter group
    (0 for biases / norms / 1-D parameters when no_decay_bias_and_norm); `impl` picks the kernel.
    groups: parameter groups of `model` to build it over instead (resolve_param_groups' result):
    each group's own options win over the config's, which become the class's defaults.
    """
    validate_optimizer_config(cfg)
    cls = optimizer_class(cfg)
    target = _target(cfg, _constructor_arguments(cfg, cls), "optimizer")
    if str(cfg.state_dtype) == "bf16":  # the same update with its moments in bf16
        from dsrecipes.training.optim.compact_adam import CompactAdam

        keep = ("lr", "betas", "eps", "weight_decay")
        target = functools.partial(CompactAdam, decoupled=_COMPACT_STATE[cls],
                                   **{k: v for k, v in target.keywords.items() if k in keep})
        cls = CompactAdam
    if groups is None:
        groups = param_groups(model, cfg.weight_decay, cfg.no_decay_bias_and_norm)
    groups = cfg.regroup(model, groups)
    params = [p for g in groups for p in g["params"]]
    if not params:
        raise ValueError(f"{type(model).__name__} has no trainable parameters to optimize")
    impl = {} if str(cfg.state_dtype) == "bf16" else _impl_kwargs(cfg, cls, target, params)
    try:
        optimizer = _call(target, groups, **impl)
    except TypeError as exc:
        arguments = sorted({**target.keywords, **impl})
        raise ValueError(f"cannot build optimizer {_display_name(cfg)} with arguments {arguments}: {exc}") from exc
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(
            f"optimizer._target_={cfg._target_!r} returned {type(optimizer).__name__}, not a torch.optim.Optimizer"
        )
    return optimizer
