"""The caller's optimizer object, or optimizer factory, when the parameters it was built over are replaced.

`deepspeed.initialize(optimizer=...)` takes an optimizer object at every ZeRO stage (at stage 3 it keeps
the object and swaps its parameters for flat fp32 partitions), or a callable that builds one from the
model parameters. FSDP2 (zero.stage=3, and stage 2 with offload, tensor / sequence / expert parallelism or
hybrid sharding) replaces the module's parameter objects with sharded DTensors when it wraps the model,
so an optimizer built before would step parameters that no longer train. dsrecipes therefore:

    spec = record_client_optimizer(optimizer, model)   # before wrapping: class, defaults, each group's
    check_rebuildable(spec)                             #   options and its parameters by name
    ... parallelize(model) ...                          # fully_shard replaces the parameters
    rebuilt = rebuild_client_optimizer(spec, module)    # the same class over the sharded parameters

`module` is the tree the optimizer steps (the strategy's optimizer_module()); with zero.offload_optimizer=cpu
its parameters are FSDP2's CPU shards, so the rebuilt optimizer keeps its state and steps on the CPU, as the
configured one does. The rebuilt instance gets `type(optimizer)(groups, **defaults)`: each group with its own
options (lr, weight_decay, betas ...; keys a scheduler added, e.g. initial_lr, too) and its parameters found
again by name, the defaults restricted to the constructor's arguments (torch's AdamW records
`decoupled_weight_decay`, which its constructor does not take). A class whose constructor needs more than
that fails before any work starts, naming the class and the way out: a factory,
`optimizer=lambda params: MyOptimizer(params, extra=...)`, which `build_from_factory` calls with the sharded
parameters (or the caller's model_parameters groups, found again by name), as DeepSpeed calls it with
model_parameters. An optimizer that has already stepped is refused: its state belongs to the old parameters
and would be lost (DeepSpeed 0.19.8 drops it silently); load state through engine.load_checkpoint instead.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

import torch
from torch import nn

log = logging.getLogger("dsrecipes")

__all__ = [
    "ClientOptimizerSpec",
    "build_from_factory",
    "check_rebuildable",
    "rebind_lr_scheduler",
    "rebuild_client_optimizer",
    "record_client_optimizer",
    "resolve_named_groups",
]


@dataclass(frozen=True)
class ClientOptimizerSpec:
    """What a client optimizer is made of, with its parameters by name (taken before wrapping)."""

    cls: type[torch.optim.Optimizer]
    defaults: dict[str, Any]
    groups: list[dict[str, Any]]  # each group's options, "params": the names of its parameters
    original: torch.optim.Optimizer

    @property
    def name(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}"


def _parameter_names(model: nn.Module) -> dict[int, str]:
    """id(parameter) -> its name in `model` (a tied parameter once, under its first name, as named_parameters)."""
    names: dict[int, str] = {}
    for name, param in model.named_parameters():
        names.setdefault(id(param), name)
    return names


def _stepped(optimizer: torch.optim.Optimizer) -> int:
    """How many parameters hold state from a step (Adagrad's state made in its constructor, step 0, is not)."""
    count = 0
    for state in optimizer.state.values():
        step = state.get("step") if isinstance(state, dict) else None
        if state and not (step is not None and float(step) == 0):
            count += 1
    return count


def record_client_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module) -> ClientOptimizerSpec:
    """The optimizer's class, defaults and groups, each parameter replaced by its name in `model`.

    Raises ValueError when the optimizer has already stepped, or holds a tensor that is not a parameter of
    `model`, naming the group.
    """
    cls_name = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
    stepped = _stepped(optimizer)
    if stepped:
        raise ValueError(
            f"the optimizer passed to initialize ({cls_name}) already holds step state for {stepped} parameter(s); "
            "dsrecipes rebuilds it over the sharded parameters and would lose that state: pass an optimizer that "
            "has not stepped, and restore training state with engine.load_checkpoint"
        )
    names = _parameter_names(model)
    groups = []
    for index, group in enumerate(optimizer.param_groups):
        members = []
        for param in group["params"]:
            name = names.get(id(param))
            if name is None:
                raise ValueError(
                    f"param_groups[{index}] of the optimizer passed to initialize ({cls_name}) holds a tensor of shape "
                    f"{tuple(param.shape)} that is not a parameter of {type(model).__name__}: build it over the "
                    "model's own parameters"
                )
            members.append(name)
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": members})
    return ClientOptimizerSpec(type(optimizer), dict(optimizer.defaults), groups, optimizer)


def _constructor_kwargs(spec: ClientOptimizerSpec) -> dict[str, Any]:
    """The defaults the constructor takes by name (all of them when it takes **kwargs)."""
    try:
        parameters = inspect.signature(spec.cls).parameters
    except (TypeError, ValueError):  # no introspectable signature: construction will tell
        return dict(spec.defaults)
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return dict(spec.defaults)
    return {k: v for k, v in spec.defaults.items()
            if k in parameters and parameters[k].kind is not inspect.Parameter.POSITIONAL_ONLY}


def _rebuild_hint(spec: ClientOptimizerSpec) -> str:
    short = spec.cls.__qualname__
    return (f"pass a callable instead, optimizer=lambda params: {short}(params, ...), which dsrecipes calls with the "
            f"sharded parameters (deepspeed.initialize takes one too), or configure the optimizer "
            f"(optimizer._target_={spec.name} with its arguments)")


def check_rebuildable(spec: ClientOptimizerSpec, why: str) -> None:
    """ValueError unless `spec.cls(param_groups, **defaults)` can be called (checked against its signature).

    why: what replaces the parameters (for the message), e.g. "zero.stage=3 shards the parameters".
    """
    try:
        signature = inspect.signature(spec.cls)
    except (TypeError, ValueError):
        return
    try:
        signature.bind([], **_constructor_kwargs(spec))
    except TypeError as err:
        raise ValueError(
            f"{why}, so dsrecipes rebuilds the optimizer passed to initialize over the sharded parameters as "
            f"{spec.cls.__qualname__}(param_groups, **optimizer.defaults); {spec.name} cannot be built that way "
            f"({err}): {_rebuild_hint(spec)}"
        ) from err


def resolve_named_groups(named_groups: list[dict], module: nn.Module, allow_missing: bool = False) -> list[dict]:
    """Groups of `module`'s parameters from groups of names, each group's other options kept as they are.

    allow_missing: names this rank does not hold (another pipeline stage's) are left out and emptied groups
    dropped; otherwise a missing name is a RuntimeError (a wrapping step renamed it).
    """
    by_name = dict(module.named_parameters())
    groups = []
    for group in named_groups:
        missing = [name for name in group["params"] if name not in by_name]
        if missing and not allow_missing:
            raise RuntimeError(f"parameter {missing[0]!r} of the optimizer's groups is not in the module the optimizer "
                               f"steps ({type(module).__name__}); a wrapping step renamed it")
        present = [name for name in group["params"] if name in by_name]
        if not present and group["params"]:
            continue
        options = {k: v for k, v in group.items() if k not in ("params", "param_names")}
        if "param_names" in group:  # built over named parameters: keep them named (torch records param_names)
            options["params"] = [(name, by_name[name]) for name in present]
        else:
            options["params"] = [by_name[name] for name in present]
        groups.append(options)
    return groups


def rebuild_client_optimizer(spec: ClientOptimizerSpec, module: nn.Module,
                             allow_missing: bool = False) -> torch.optim.Optimizer:
    """A new `spec.cls` over `module`'s parameters: the same groups (by name), per-group options and defaults."""
    groups = resolve_named_groups(spec.groups, module, allow_missing)
    if not groups:
        raise ValueError(f"the optimizer passed to initialize ({spec.name}) holds no parameter that this rank optimizes")
    kwargs = _constructor_kwargs(spec)
    try:
        rebuilt = spec.cls(groups, **kwargs)
    except TypeError as err:
        raise ValueError(f"cannot rebuild the optimizer passed to initialize ({spec.name}) over the sharded parameters "
                         f"with {sorted(kwargs)}: {err}; {_rebuild_hint(spec)}") from err
    log.info("the optimizer passed to initialize (%s, %d param group(s)) was rebuilt over the sharded parameters; "
             "initialize returns the rebuilt one", spec.cls.__qualname__, len(rebuilt.param_groups))
    return rebuilt


def build_from_factory(factory: Callable[..., torch.optim.Optimizer], module: nn.Module,
                       named_groups: list[dict] | None = None, allow_missing: bool = False) -> torch.optim.Optimizer:
    """factory(parameters): as DeepSpeed calls a callable optimizer with model_parameters.

    The parameters are `module`'s (the tree the optimizer steps, sharded or fp32 masters), all of them as
    DeepSpeed passes module.parameters(), or the caller's model_parameters groups found again by name.
    """
    params = (list(module.parameters()) if named_groups is None
              else resolve_named_groups(named_groups, module, allow_missing))
    name = getattr(factory, "__qualname__", type(factory).__qualname__)
    optimizer = factory(params)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"the optimizer callable passed to initialize ({name}) returned {type(optimizer).__name__}, "
                         "not a torch.optim.Optimizer")
    return optimizer


def rebind_lr_scheduler(scheduler: Any, old: torch.optim.Optimizer, new: torch.optim.Optimizer) -> None:
    """Point a scheduler built on the client optimizer at its rebuilt instance (DeepSpeed keeps the object,
    so such a scheduler goes on working there). torch's LRScheduler also marks the optimizer's step to check
    the call order; the rebuilt step gets the same mark."""
    if getattr(scheduler, "optimizer", None) is not old:
        return
    scheduler.optimizer = new
    if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler) and not hasattr(new.step, "_wrapped_by_lr_sched"):
        step = new.step

        @wraps(step)
        def tracked_step(*args, **kwargs):
            new._opt_called = True
            return step(*args, **kwargs)

        tracked_step._wrapped_by_lr_sched = True
        new.step = tracked_step
