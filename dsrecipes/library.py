"""`dsrecipes.initialize`: the library path, shaped like `deepspeed.initialize`.

    import dsrecipes
    engine, optimizer, dataloader, lr_scheduler = dsrecipes.initialize(
        model=my_module,
        training_data=my_dataset,                 # optional: a micro-batch DataLoader is built
        config={"trainer": {"train_batch_size": 32, "gradient_accumulation_steps": 2},
                "optimizer": {"lr": 3e-4}, "precision": {"dtype": "bf16"}},
    )
    for batch in dataloader:
        loss = my_loss(engine(batch))
        engine.backward(loss)
        engine.step()

`config` may be a dict, a DictConfig, a YAML path or a list of Hydra overrides (see
dsrecipes.config.loading); only the engine's groups (trainer batch/clipping/device, optimizer,
lr_scheduler, precision, checkpoint, zero) matter here.
"""

from __future__ import annotations

import dataclasses

import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler

from dsrecipes.config.loading import load_config
from dsrecipes.config.schema import RootConfig
from dsrecipes.config.validate import data_parallel_world_size, to_root, validate_engine_config
from dsrecipes.distributed.parallel_dims import ParallelDims, device_type_of
from dsrecipes.distributed.pipeline_parallel import PipelineParallel
from dsrecipes.distributed.sequence_parallel import SequenceParallel
from dsrecipes.distributed.tensor_parallel import apply_tensor_parallel
from dsrecipes.distributed.utils import is_distributed
from dsrecipes.distributed.expert_parallel import setup_expert_parallel, split_expert_param_groups
from dsrecipes.distributed.zero import shard_model, shard_optimizer, unwrap, uses_fsdp
from dsrecipes.distributed.zero2 import ZeroStage2, replicated_stage2_applies
from dsrecipes.training.batch import BatchSizes
from dsrecipes.training.engine import Engine
from dsrecipes.training.lr_schedules import build_lr_scheduler
from dsrecipes.training.optimizers import build_optimizer, optimizer_class, supported_impls
from dsrecipes.training.precision import Precision
from dsrecipes.utils.device import resolve_device


def build_engine(
    model: nn.Module,
    cfg: RootConfig,
    batch: BatchSizes,
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler=None,
    config_yaml: str | None = None,
) -> Engine:
    """Place and shard the model (its ZeRO stage), build what the user did not pass, wrap it in an Engine."""
    device = resolve_device(cfg.trainer.device)
    world = data_parallel_world_size()
    par = cfg.parallel
    dims = ParallelDims.from_zero(world, cfg.zero.stage, cfg.zero.hybrid_shard_size, tp=par.tp, sp=par.sp, pp=par.pp)
    ep_size = cfg.moe.ep_size if cfg.moe.enabled else 1
    # plain data-parallel ZeRO-2 keeps the parameters replicated (zero2.py); its combinations use FSDP2
    replicated2 = replicated_stage2_applies(cfg.zero, dims, sequence_parallel=par.sp > 1, expert_parallel=ep_size > 1)
    fsdp = uses_fsdp(cfg.zero, dims.dp) and not replicated2
    if optimizer is not None and fsdp:
        raise ValueError(
            f"zero.stage={cfg.zero.stage} shards the parameters, so dsrecipes must build the optimizer after "
            "sharding: pass the optimizer through config (optimizer.name or optimizer._target_), not as an object"
        )
    model.to(device)
    mesh = dims.build_mesh(device_type_of(device)) if dims.model_parallel else None
    if dims.tp > 1:
        apply_tensor_parallel(model, mesh["tp"], sequence_parallel=par.tp_sequence_parallel)
    sequence_parallel = None
    if dims.sp > 1:  # after kernel injection (the recipe's model transforms): Ulysses wraps its attention
        sequence_parallel = SequenceParallel(mesh["sp"].get_group())
        sequence_parallel.install(model)
        # ZeRO / DDP then reduce over dp x sp: every rank's loss is its chunk's mean, so the mean over
        # all of them is the global batch mean (sequence parallelism composes with tp = pp = 1 here)
        dims, mesh = ParallelDims.from_zero(world, cfg.zero.stage, cfg.zero.hybrid_shard_size), None
        fsdp = uses_fsdp(cfg.zero, dims.dp) and not replicated2
    pipeline = None
    if dims.pp > 1:  # this rank keeps its stages; each stage's gradients are averaged over its dp group
        all_pipelines = mesh.mesh.reshape(dims.pp, -1).t().tolist()
        dp_group = mesh["dp_replicate"].get_group() if dims.dp > 1 else None
        pipeline = PipelineParallel(model, mesh["pp"].get_group(), par.pp_schedule, batch.gradient_accumulation_steps,
                                    par.pp_partition, device, all_pipelines=all_pipelines, dp_group=dp_group)
        model = pipeline.local_module(model)
    expert_parallel = setup_expert_parallel(model, ep_size, device)
    ignored = expert_parallel.ignored_params if expert_parallel is not None else None
    if pipeline is None and not replicated2:
        model = shard_model(model, cfg.zero, dims, device, cfg.precision.dtype, ignored_params=ignored, mesh=mesh)
    optimizer_cfg = cfg.optimizer
    if dims.tp > 1 and optimizer_cfg.impl == "auto" and "for_loop" in supported_impls(optimizer_class(optimizer_cfg)):
        # tensor-parallel DTensor and replicated plain parameters cannot share torch's foreach kernels
        optimizer_cfg = dataclasses.replace(optimizer_cfg, impl="for_loop")
    optimizer = optimizer or build_optimizer(optimizer_cfg, unwrap(model))
    split_expert_param_groups(optimizer, unwrap(model))
    optimizer = shard_optimizer(optimizer, cfg.zero, dims.dp)
    precision = Precision(cfg.precision, device)
    zero2 = None
    if replicated2:  # the optimizer, built over the model's parameters, now steps their sharded masters
        dp_mesh = dims.build_mesh(device_type_of(device))["dp_shard"]
        low_precision = precision.compute_dtype if cfg.precision.master_weights else None
        zero2 = ZeroStage2(unwrap(model), dp_mesh, low_precision)
        optimizer = zero2.shard_optimizer(optimizer)
    if lr_scheduler is None:
        lr_scheduler = build_lr_scheduler(cfg.lr_scheduler, optimizer, cfg.trainer.max_steps)
    elif callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
        lr_scheduler = lr_scheduler(optimizer)
    return Engine(
        model,
        optimizer,
        lr_scheduler,
        batch,
        precision,
        gradient_clipping=cfg.trainer.gradient_clipping,
        keep_last_checkpoints=cfg.checkpoint.keep_last,
        config_yaml=config_yaml,
        rank=torch.distributed.get_rank() if is_distributed() else 0,
        sharded_params=fsdp,
        zero2=zero2,
        expert_parallel=expert_parallel,
        loss_parallel=dims.tp > 1,
        sequence_parallel=sequence_parallel,
        pipeline=pipeline,
    )


def initialize(
    model: nn.Module,
    config=None,
    optimizer: torch.optim.Optimizer | None = None,
    training_data: Dataset | None = None,
    lr_scheduler=None,
    collate_fn=None,
):
    """Returns (engine, optimizer, dataloader or None, lr_scheduler), like deepspeed.initialize."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    composed = load_config(config)
    cfg = to_root(composed)
    batch = validate_engine_config(cfg, data_parallel_world_size())
    engine = build_engine(model, cfg, batch, optimizer, lr_scheduler, OmegaConf.to_yaml(composed))
    dataloader = None
    if training_data is not None:
        generator = torch.Generator().manual_seed(cfg.trainer.seed)
        if is_distributed():
            sampler = DistributedSampler(training_data, seed=cfg.trainer.seed)
        else:
            sampler = RandomSampler(training_data, generator=generator)
        dataloader = DataLoader(training_data, batch_size=batch.micro_batch_size, sampler=sampler, collate_fn=collate_fn)
    return engine, engine.optimizer, dataloader, engine.lr_scheduler
