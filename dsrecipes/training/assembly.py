"""Assembly: how a recipe and a model become a running Engine (the same steps for both entry paths).

    config -> ParallelDims (every mesh, validated once; built by the caller and passed in)
           -> Precision(cfg.precision)                  before anything wraps parameters
           -> parallelize(model, dims, cfg, precision)  the techniques in one order, then the strategy
           -> optimizer over strategy.optimizer_module() (or over the caller's parameter groups, found
              there by the names they had before wrapping), adopted (partitioned) by the strategy;
              a caller's optimizer object is taken as it is, or, where wrapping replaces the
              parameters (FSDP2), rebuilt over them (dsrecipes.training.optim.client_optimizer); a
              caller's optimizer callable is called with them
           -> LR schedule, step runner (micro-batches, or the pipeline schedule)
           -> Engine(plan, optimizer, schedule, batch, precision, runner)

Used by the recipe Trainer and by `dsrecipes.initialize`.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings

import torch
from torch import nn

from dsrecipes.data.config import weights_loss_by_tokens
from dsrecipes.distributed.data_parallel import STRATEGIES, choose_strategy
from dsrecipes.distributed.expert_parallel import split_expert_param_groups
from dsrecipes.distributed.parallel_dims import ParallelDims
from dsrecipes.distributed.parallelize import ParallelPlan, parallelize
from dsrecipes.distributed.utils import is_distributed
from dsrecipes.training.batch import BatchSizes
from dsrecipes.training.engine import Engine
from dsrecipes.training.layout import describe_layout
from dsrecipes.training.optim.client_optimizer import (
    build_from_factory,
    check_rebuildable,
    rebind_lr_scheduler,
    rebuild_client_optimizer,
    record_client_optimizer,
)
from dsrecipes.training.optim.lr_schedules import build_lr_scheduler
from dsrecipes.training.optim.optimizers import (
    build_optimizer,
    named_param_groups,
    optimizer_class,
    resolve_param_groups,
    supported_impls,
)
from dsrecipes.training.optim.state_bytes import optimizer_state_of
from dsrecipes.training.precision import Precision
from dsrecipes.training.runners import MicroBatchRunner, PipelineRunner, StepRunner
from dsrecipes.utils.device import resolve_device

log = logging.getLogger("dsrecipes")


def build_engine(
    model: nn.Module,
    cfg,
    batch: BatchSizes,
    dims: ParallelDims,
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler=None,
    config_yaml: str | None = None,
    transforms=(),
    model_parameters=None,
    materialize=None,
    model_description: str | None = None,
) -> Engine:
    """Place and parallelize the model, build what the caller did not pass, wrap it all in an Engine.

    cfg: the RootConfig; transforms: model transforms of the caller applied inside parallelize
    (step 4: the recipe's compression and random-LTD); optimizer / lr_scheduler: objects (or
    callables: optimizer(parameters), lr_scheduler(optimizer)) that replace the configured ones. An
    optimizer object whose parameters the strategy replaces (FSDP2) is rebuilt over the sharded ones
    (same class, defaults and per-group options), and a scheduler built on it is pointed at the rebuilt one;
    model_parameters: the parameters (or param-group dicts with per-group options) the configured
    optimizer is built over, as DeepSpeed's argument of that name (see dsrecipes.training.optim.optimizers).
    They are recorded by name before parallelize, which may replace the parameter objects (FSDP2,
    tensor parallelism, kernel injection), and looked up by name in the tree the optimizer steps
    (with fp32 master weights: the masters, which are the caller's original parameters);
    materialize: fills a model built on the meta device (dsrecipes.models.hf_loading; see parallelize);
    model_description: the layout line's model part (which way a Hugging Face checkpoint runs).
    """
    factory = None
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer or a callable building one from the "
                            f"parameters, got {type(optimizer).__name__}")
        factory, optimizer = optimizer, None
    named_groups = None
    if model_parameters is not None:
        if optimizer is not None:
            warnings.warn("model_parameters is ignored: the optimizer object passed to initialize already holds "
                          "its parameter groups", stacklevel=3)
        else:
            named_groups = named_param_groups(model_parameters, model)
    client = None
    if optimizer is not None and STRATEGIES[choose_strategy(cfg.zero, dims)].needs_own_optimizer:
        client = record_client_optimizer(optimizer, model)  # by name, before wrapping replaces the parameters
        check_rebuildable(client, f"zero.stage={cfg.zero.stage} shards the parameters (FSDP2)")
    device = resolve_device(cfg.trainer.device)
    precision = Precision(cfg.precision, device)
    _to_device(model, device)
    if precision.bf16_masters:  # the weights are the masters: bf16 from here on, for every strategy alike
        model.to(torch.bfloat16)  # floating parameters and buffers (meta ones too)
    plan = parallelize(model, dims, cfg, precision, device, micro_batches=batch.gradient_accumulation_steps,
                       transforms=transforms, materialize=materialize)
    if model_description:
        plan.model_description = model_description
    strategy = plan.strategy
    assert (client is not None) == (optimizer is not None and strategy.needs_own_optimizer), strategy.name
    elsewhere = not plan.holds_every_parameter  # stages or experts on other ranks
    if client is not None:
        optimizer = rebuild_client_optimizer(client, strategy.optimizer_module(), allow_missing=elsewhere)
        rebind_lr_scheduler(lr_scheduler, client.original, optimizer)
    elif factory is not None:
        optimizer = build_from_factory(factory, strategy.optimizer_module(), named_groups, allow_missing=elsewhere)
    state_part = f"client {type(optimizer).__name__}, state not counted" if optimizer is not None else None
    if optimizer is None:
        optimizer_cfg, module = _optimizer_config(cfg, dims), strategy.optimizer_module()
        state_part = optimizer_state_of(optimizer_cfg, module, bf16_weights=precision.bf16_masters).description
        groups = None
        if named_groups is not None:
            groups = resolve_param_groups(named_groups, module, optimizer_cfg, allow_missing=elsewhere)
            if not groups:
                raise ValueError("model_parameters holds no trainable parameter that this rank optimizes")
        optimizer = build_optimizer(optimizer_cfg, module, groups)
    split_expert_param_groups(optimizer, strategy.unwrapped)
    optimizer = strategy.adopt_optimizer(optimizer)
    if lr_scheduler is None:
        lr_scheduler = build_lr_scheduler(cfg.lr_scheduler, optimizer, cfg.trainer.max_steps)
    elif callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
        lr_scheduler = lr_scheduler(optimizer)
    layout = describe_layout(plan, cfg, precision, optimizer=state_part)
    log.info("layout: %s", layout)
    engine = Engine(
        plan,
        optimizer,
        lr_scheduler,
        batch,
        precision,
        runner=_runner(plan, cfg),
        gradient_clipping=cfg.trainer.gradient_clipping,
        keep_last_checkpoints=cfg.checkpoint.keep_last,
        config_yaml=config_yaml,
        rank=torch.distributed.get_rank() if is_distributed() else 0,
        layout=layout,
    )
    engine.post_step_hooks.extend(plan.post_step_hooks)
    return engine


def _to_device(model: nn.Module, device: torch.device) -> None:
    """model.to(device), leaving meta tensors (parts another pipeline rank holds) where they are."""
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        model._apply(lambda t: t if t.is_meta else t.to(device))
    else:
        model.to(device)


def _optimizer_config(cfg, dims: ParallelDims):
    """optimizer.impl auto steps one parameter at a time where DTensor and plain parameters share a rank (torch's
    foreach kernels take one kind per call)."""
    optimizer_cfg = cfg.optimizer
    if (dims.mixes_parameter_kinds and optimizer_cfg.impl == "auto"
            and "for_loop" in supported_impls(optimizer_class(optimizer_cfg))):
        optimizer_cfg = dataclasses.replace(optimizer_cfg, impl="for_loop")
    return optimizer_cfg


def _runner(plan: ParallelPlan, cfg) -> StepRunner:
    if plan.pipeline is not None:
        return PipelineRunner(plan.pipeline, plan.sequence_parallel)
    return MicroBatchRunner(plan.sequence_parallel, token_weighted=weights_loss_by_tokens(getattr(cfg, "data", None)))
