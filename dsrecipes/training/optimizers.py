"""Optimizer construction: DeepSpeed's optimizer names on torch's classes, parameter groups and kernels.

What: `build_optimizer(cfg, model)` turns an `OptimizerConfig` into a `torch.optim.Optimizer` over
the model's trainable parameters, split into a decayed group (matrices) and an undecayed group
(biases, norm weights and other 1-D parameters) when `no_decay_bias_and_norm` is set.

Names follow DeepSpeed's config (`optimizer.type`):

    adamw    torch.optim.AdamW
    adam     torch.optim.AdamW while adam_w_mode is true (DeepSpeed's default: "Adam" decouples
             weight decay), torch.optim.Adam (L2 weight decay in the gradient) when it is false
    sgd      torch.optim.SGD (momentum, nesterov)
    adagrad  torch.optim.Adagrad (lr_decay, eps)
    lamb     dsrecipes.training.lamb.Lamb (FusedLamb's update and trust-ratio clamp)
    lion     dsrecipes.training.lion.Lion

and `_target_` names any other optimizer class by import path (e.g. torch.optim.RMSprop), built
as `cls(param_groups, lr=cfg.lr, **cfg.kwargs)`, much like DeepSpeed's fallback to
`getattr(torch.optim, type)`. For the built-ins `cfg.kwargs` are extra keyword arguments that override
the ones derived from the config, so every argument of the class is reachable.

Why torch's own kernels: instead of DeepSpeed's hand-written CUDA optimizers, `impl` selects the
fused / foreach / for-loop implementations torch already has. `auto` picks fused when every
parameter is on CUDA and the class has a working fused kernel for them, else foreach.

This module imports no Hydra: `_target_` is resolved with importlib.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from typing import Any, Callable

import torch
from torch import nn

from dsrecipes.training.config import OptimizerConfig
from dsrecipes.training.lamb import Lamb
from dsrecipes.training.lion import Lion

__all__ = [
    "OPTIMIZERS",
    "OPTIMIZER_IMPLS",
    "build_optimizer",
    "optimizer_class",
    "param_groups",
    "resolve_target",
    "supported_impls",
    "validate_optimizer_config",
]

OPTIMIZERS = ("adamw", "adam", "sgd", "adagrad", "lamb", "lion")
OPTIMIZER_IMPLS = ("auto", "fused", "foreach", "for_loop")

# Arguments build_optimizer always sets itself: kwargs must not repeat them.
_RESERVED_KWARGS = {
    "params": "the model's parameters are passed by the engine",
    "lr": "set optimizer.lr instead",
    "weight_decay": "set optimizer.weight_decay instead (it is applied per parameter group)",
}
_IMPL_KWARGS = ("fused", "foreach")


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


def resolve_target(path: str, key: str = "optimizer._target_") -> Callable[..., torch.optim.Optimizer]:
    """The object at dotted import path `path` (e.g. "torch.optim.RMSprop"), imported with importlib.

    Tries the longest importable module prefix, then walks attributes (so nested classes work).
    Raises ValueError naming `key` and the value when the path cannot be resolved to a callable.
    """
    parts = path.split(".") if isinstance(path, str) else []
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"{key}={path!r} is not a dotted import path such as 'torch.optim.RMSprop'")
    error: Exception | None = None
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as exc:
            error = error or exc
            continue
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError as exc:
            raise ValueError(f"{key}={path!r} cannot be imported: {exc}") from None
        if not callable(obj):
            raise ValueError(f"{key}={path!r} is not a class or callable")
        return obj
    raise ValueError(f"{key}={path!r} cannot be imported: {error}") from None


def optimizer_class(cfg: OptimizerConfig, prefix: str = "optimizer") -> Callable[..., torch.optim.Optimizer]:
    """The class `cfg` builds: the `_target_` one when set, else the one for `cfg.name`."""
    if cfg._target_:
        return resolve_target(cfg._target_, f"{prefix}._target_")
    classes = {
        "adamw": torch.optim.AdamW,
        "adam": torch.optim.AdamW if cfg.adam_w_mode else torch.optim.Adam,
        "sgd": torch.optim.SGD,
        "adagrad": torch.optim.Adagrad,
        "lamb": Lamb,
        "lion": Lion,
    }
    if cfg.name not in classes:
        raise ValueError(
            f"{prefix}.name={cfg.name!r} is not valid; choose one of: {', '.join(OPTIMIZERS)} "
            f"(or set {prefix}._target_ to a torch.optim class)"
        )
    return classes[cfg.name]


def supported_impls(cls: Callable[..., Any]) -> tuple[str, ...]:
    """The `impl` values `cls` accepts: auto always; fused / foreach / for_loop by its signature."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    impls = ["auto"]
    if "fused" in params:
        impls.append("fused")
    if "foreach" in params:
        impls.extend(["foreach", "for_loop"])
    return tuple(impls)


def _display_name(cfg: OptimizerConfig) -> str:
    """How messages name the optimizer: the `_target_` path or the built-in name."""
    return cfg._target_ or cfg.name


def _check_impl_supported(cfg: OptimizerConfig, cls: Callable[..., Any], prefix: str) -> None:
    """ValueError when `cfg.impl` is not one `cls` can run, naming the choices it has."""
    if cfg.impl not in OPTIMIZER_IMPLS:
        raise ValueError(f"{prefix}.impl={cfg.impl!r} is not valid; choose one of: {', '.join(OPTIMIZER_IMPLS)}")
    impls = supported_impls(cls)
    if cfg.impl not in impls:
        raise ValueError(
            f"{prefix}.impl={cfg.impl!r} is not supported by {_display_name(cfg)}; choose one of: {', '.join(impls)}"
        )


def validate_optimizer_config(cfg: OptimizerConfig, prefix: str = "optimizer") -> None:
    """Raise ValueError (naming key, value and what is valid) on a config no optimizer can be built from.

    Checks the name (or that `_target_` imports), impl (in general and for this class), lr > 0,
    betas = two values in [0, 1), non-negative weight_decay / eps / momentum / lr_decay,
    nesterov only with momentum (sgd), 0 <= min_coeff <= max_coeff, and kwargs not repeating
    lr / weight_decay / params.
    """
    cls = optimizer_class(cfg, prefix)
    _check_impl_supported(cfg, cls, prefix)
    if not cfg.lr > 0:
        raise ValueError(f"{prefix}.lr={cfg.lr} must be > 0")
    betas = list(cfg.betas)
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"{prefix}.betas={betas} must be two values in [0, 1)")
    for key in ("weight_decay", "eps", "momentum", "lr_decay"):
        value = getattr(cfg, key)
        if value < 0:
            raise ValueError(f"{prefix}.{key}={value} must be >= 0")
    if cfg.name == "sgd" and not cfg._target_ and cfg.nesterov and cfg.momentum <= 0:
        raise ValueError(f"{prefix}.nesterov=true needs {prefix}.momentum > 0 (got momentum={cfg.momentum})")
    if cfg.min_coeff < 0 or cfg.min_coeff > cfg.max_coeff:
        raise ValueError(
            f"{prefix}.min_coeff={cfg.min_coeff} and {prefix}.max_coeff={cfg.max_coeff}: "
            "need 0 <= min_coeff <= max_coeff"
        )
    for key, hint in _RESERVED_KWARGS.items():
        if key in cfg.kwargs:
            raise ValueError(f"{prefix}.kwargs.{key}={cfg.kwargs[key]!r} is not allowed: {hint}")
    if cfg.impl != "auto":
        clash = [k for k in _IMPL_KWARGS if k in cfg.kwargs]
        if clash:
            raise ValueError(
                f"{prefix}.kwargs.{clash[0]} conflicts with {prefix}.impl={cfg.impl!r}; set only one of them"
            )


def _builtin_kwargs(cfg: OptimizerConfig) -> dict:
    """Keyword arguments (besides params and impl) of the built-in optimizer `cfg.name`."""
    betas = tuple(cfg.betas)
    if cfg.name in ("adamw", "adam"):
        return {"lr": cfg.lr, "betas": betas, "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    if cfg.name == "sgd":
        return {"lr": cfg.lr, "momentum": cfg.momentum, "nesterov": cfg.nesterov, "weight_decay": cfg.weight_decay}
    if cfg.name == "adagrad":
        return {"lr": cfg.lr, "lr_decay": cfg.lr_decay, "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    if cfg.name == "lamb":
        return {
            "lr": cfg.lr, "betas": betas, "eps": cfg.eps, "weight_decay": cfg.weight_decay,
            "max_coeff": cfg.max_coeff, "min_coeff": cfg.min_coeff,
        }
    if cfg.name == "lion":
        return {"lr": cfg.lr, "betas": betas, "weight_decay": cfg.weight_decay}
    raise AssertionError(f"no built-in optimizer {cfg.name!r}")  # unreachable after validation


def _fused_works(cls: Callable[..., Any], kwargs: dict, params: list[torch.Tensor]) -> tuple[bool, str]:
    """Whether `cls(..., fused=True)` can step tensors of every (device, dtype) in `params`.

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
                cls([probe], **kwargs, fused=True).step()
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
            return False, f"{device.type} {str(dtype).replace('torch.', '')} parameters: {exc}"
    return True, ""


def _impl_kwargs(cfg: OptimizerConfig, cls: Callable[..., Any], kwargs: dict, params: list[torch.Tensor]) -> dict:
    """The fused= / foreach= arguments that select `cfg.impl` for `cls` (empty when it has neither)."""
    impls = supported_impls(cls)
    if cfg.impl == "auto":
        if any(k in kwargs for k in _IMPL_KWARGS):
            return {}  # the user chose through kwargs
        on_cuda = bool(params) and all(p.is_cuda for p in params)
        if "fused" in impls and on_cuda and _fused_works(cls, kwargs, params)[0]:
            return {"fused": True}
        return {"foreach": True} if "foreach" in impls else {}
    if cfg.impl == "fused":
        ok, reason = _fused_works(cls, kwargs, params)
        if not ok:
            raise ValueError(
                f"optimizer.impl='fused' is not available for {_display_name(cfg)} on {reason}; "
                "choose auto, foreach or for_loop"
            )
        return {"fused": True}
    return {"foreach": cfg.impl == "foreach"}


def build_optimizer(cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """The configured optimizer over `model`'s trainable parameters.

    Validates `cfg` first (see validate_optimizer_config). Weight decay is set per parameter group
    (0 for biases / norms / 1-D parameters when no_decay_bias_and_norm); `impl` picks the kernel.
    """
    validate_optimizer_config(cfg)
    cls = optimizer_class(cfg)
    groups = param_groups(model, cfg.weight_decay, cfg.no_decay_bias_and_norm)
    params = [p for g in groups for p in g["params"]]
    if not params:
        raise ValueError(f"{type(model).__name__} has no trainable parameters to optimize")
    if cfg._target_:
        kwargs = {"lr": cfg.lr, **cfg.kwargs}
    else:
        kwargs = {**_builtin_kwargs(cfg), **cfg.kwargs}
    kwargs.update(_impl_kwargs(cfg, cls, kwargs, params))
    try:
        optimizer = cls(groups, **kwargs)
    except TypeError as exc:
        raise ValueError(f"cannot build optimizer {_display_name(cfg)} with arguments {sorted(kwargs)}: {exc}") from exc
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(
            f"optimizer._target_={cfg._target_!r} returned {type(optimizer).__name__}, not a torch.optim.Optimizer"
        )
    return optimizer
