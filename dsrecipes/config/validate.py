"""Cross-field validation of a composed recipe, run once before any expensive work starts.

Each check raises ValueError naming the key, its value and what would be valid; schema-level
problems (unknown keys, wrong types) were already caught by Hydra/OmegaConf at composition.
"""

from __future__ import annotations

import os
import warnings

from omegaconf import DictConfig, OmegaConf

from dsrecipes.config.schema import RootConfig, validate_kernels_config
from dsrecipes.data.config import validate_data_config
from dsrecipes.data_efficiency.config import validate_data_efficiency_config
from dsrecipes.distributed.activation_checkpoint import validate_activation_checkpoint_config
from dsrecipes.distributed.config import validate_zero_config
from dsrecipes.distributed.parallel_dims import ParallelDims
from dsrecipes.distributed.sequence_parallel import validate_sequence_parallel_recipe
from dsrecipes.models.config import validate_model_config
from dsrecipes.models.moe_config import validate_moe_config
from dsrecipes.models.sparse_attention import validate_sparse_attention_config
from dsrecipes.training.batch import BatchSizes, resolve_batch_sizes
from dsrecipes.training.lr_schedules import validate_lr_scheduler_config
from dsrecipes.training.optimizers import validate_optimizer_config
from dsrecipes.training.precision import validate_precision_config
from dsrecipes.utils.device import resolve_device

WANDB_MODES = ("auto", "offline", "online", "disabled")


def _choice(key: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def _positive(key: str, value, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}")


def to_root(cfg: RootConfig | DictConfig) -> RootConfig:
    """A typed RootConfig object from a composed DictConfig (interpolations resolved)."""
    return OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg


def data_parallel_world_size() -> int:
    """World size the batch arithmetic uses: torch.distributed's, else WORLD_SIZE, else 1."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def parallel_dims(cfg: RootConfig, world_size: int) -> ParallelDims:
    """The run's layout: raises naming parallel.* / zero.* when the degrees do not fit the world size."""
    par = getattr(cfg, "parallel", None)
    degrees = dict(tp=par.tp, sp=par.sp, pp=par.pp) if par is not None else {}
    return ParallelDims.from_zero(world_size, cfg.zero.stage, cfg.zero.hybrid_shard_size, **degrees)


def validate_engine_config(cfg: RootConfig, world_size: int) -> BatchSizes:
    """Checks of everything the Engine consumes; returns the resolved batch sizes.

    world_size is the number of processes; the batch triple uses the data-parallel part of it,
    world_size / (parallel.tp x parallel.sp x parallel.pp).
    """
    t = cfg.trainer
    validate_zero_config(cfg.zero)
    dims = parallel_dims(cfg, world_size)
    dp_world_size = dims.dp
    batch = resolve_batch_sizes(
        t.train_batch_size, t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps, dp_world_size
    )
    resolve_device(t.device)
    _positive("trainer.max_steps", t.max_steps)
    _positive("trainer.log_interval", t.log_interval)
    _positive("trainer.eval_interval", t.eval_interval, allow_zero=True)
    _positive("trainer.eval_batches", t.eval_batches, allow_zero=True)
    _positive("trainer.gradient_clipping", t.gradient_clipping, allow_zero=True)
    _positive("trainer.sample_tokens", t.sample_tokens, allow_zero=True)
    validate_optimizer_config(cfg.optimizer)
    validate_lr_scheduler_config(cfg.lr_scheduler, t.max_steps)
    validate_precision_config(cfg.precision)
    _positive("checkpoint.interval", cfg.checkpoint.interval, allow_zero=True)
    _positive("checkpoint.keep_last", cfg.checkpoint.keep_last, allow_zero=True)
    if cfg.zero.stage > 0 and dp_world_size == 1 and not dims.model_parallel:
        warnings.warn(
            f"zero.stage={cfg.zero.stage} with a data-parallel world size of 1: there is nothing to shard, "
            "the run trains as stage 0",
            stacklevel=2,
        )
    return batch


def validate_moe_layout(root: RootConfig, world_size: int) -> None:
    """The moe group's own checks, then what expert parallelism composes with (docs: README, MoE)."""
    validate_moe_config(root.moe, root.model, world_size)
    if not root.moe.enabled or root.moe.ep_size == 1 or world_size == 1:
        return
    if root.zero.stage == 1:
        raise ValueError(
            f"moe.ep_size={root.moe.ep_size} with zero.stage=1 is not supported (ZeRO-1's optimizer shards "
            "would mix different ranks' experts); use zero.stage 0, 2 or 3"
        )
    if root.precision.master_weights and root.zero.stage == 0:
        raise ValueError(
            f"moe.ep_size={root.moe.ep_size} with precision.master_weights=true and zero.stage=0 is not "
            "supported (full-state checkpoints hold one rank's experts); use precision=bf16 (autocast) or "
            "zero.stage 2/3, whose sharded fp32 parameters are the master weights"
        )


def validate_compression_recipe(root: RootConfig, dp_world_size: int) -> None:
    """The compression group's values, and the layouts its masks can follow (not FSDP-sharded parameters)."""
    from dsrecipes.compression.config import validate_compression_config

    comp = root.compression
    validate_compression_config(comp, n_head=root.model.n_head, n_layer=root.model.n_layer)
    pruning = [k for k in ("sparse_pruning", "row_pruning", "head_pruning", "channel_pruning") if getattr(comp, k).enabled]
    if pruning and root.zero.stage >= 2 and dp_world_size > 1:
        raise ValueError(
            f"compression.{pruning[0]}.enabled=true with zero.stage={root.zero.stage} at world size {dp_world_size}: "
            "pruning masks need unsharded parameters; use zero.stage 0 or 1"
        )


def validate_pipeline_layout(root: RootConfig, dims: ParallelDims) -> None:
    """parallel.pp > 1: schedule, partition, stages vs blocks, micro-batches vs stages, and what composes."""
    from dsrecipes.distributed.pipeline_parallel import PP_PARTITIONS, PP_SCHEDULES, stages_per_rank

    par, t = root.parallel, root.trainer
    _choice("parallel.pp_schedule", par.pp_schedule, PP_SCHEDULES)
    _choice("parallel.pp_partition", par.pp_partition, PP_PARTITIONS)
    stages = par.pp * stages_per_rank(par.pp_schedule)
    if root.model.n_layer < stages:
        raise ValueError(f"parallel.pp={par.pp} with pp_schedule={par.pp_schedule} makes {stages} stages, more than "
                         f"model.n_layer={root.model.n_layer} blocks")
    gas = resolve_batch_sizes(t.train_batch_size, t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps,
                              dims.dp).gradient_accumulation_steps
    if gas < par.pp:
        raise ValueError(f"parallel.pp={par.pp} needs at least {par.pp} micro-batches per step (micro-batches = "
                         f"trainer.gradient_accumulation_steps, as in DeepSpeed); got {gas}")
    if par.pp_schedule == "interleaved_1f1b" and gas % par.pp:
        raise ValueError(f"parallel.pp_schedule=interleaved_1f1b needs micro-batches (gradient_accumulation_steps={gas}) "
                         f"divisible by parallel.pp={par.pp}")
    others = {"parallel.sp": par.sp > 1, "moe.num_experts": root.moe.enabled,
              "precision.dtype=fp16 (loss scaling)": root.precision.dtype == "fp16",
              "precision.master_weights": root.precision.master_weights,
              "data_efficiency.random_ltd": root.data_efficiency.random_ltd.enabled,
              "compression": any(getattr(v, "enabled", False) for v in vars(root.compression).values())}
    for key, used in others.items():
        if used:
            raise ValueError(f"parallel.pp={par.pp} with {key} is not supported yet")
    if dims.dp > 1 and root.zero.stage > 0:
        raise ValueError(f"parallel.pp={par.pp} with {dims.dp} data-parallel ranks needs zero.stage=0 (each stage's "
                         f"gradients are averaged over its data-parallel ranks; ZeRO sharding of stages is not "
                         f"implemented); "
                         f"got zero.stage={root.zero.stage}")


def validate_parallel_layout(root: RootConfig, world_size: int) -> None:
    """Model-parallel degrees against the model, the data and the other groups (README: compatibility matrix)."""
    dims = parallel_dims(root, world_size)
    par, model = root.parallel, root.model
    if par.pp > 1:
        validate_pipeline_layout(root, dims)
    if par.sp > 1:
        validate_sequence_parallel_recipe(root)
        if par.tp > 1:
            raise ValueError(f"parallel.sp={par.sp} with parallel.tp={par.tp} is not supported yet; use one of them")
        if root.moe.enabled:
            raise ValueError(f"parallel.sp={par.sp} with moe.num_experts={root.moe.num_experts} is not supported yet")
    if par.tp == 1:
        return
    tp = par.tp
    for key, value in (("model.n_head", model.n_head), ("model.n_kv_head", model.kv_heads), ("model.d_ff", model.ffn_dim)):
        if value % tp:
            raise ValueError(f"parallel.tp={tp} does not divide {key}={value}: every rank must hold whole heads / equal MLP shards")
    if par.tp_sequence_parallel and root.data.block_size % tp:
        raise ValueError(f"parallel.tp={tp} with parallel.tp_sequence_parallel=true needs data.block_size divisible by "
                         f"{tp} (equal sequence shards); got data.block_size={root.data.block_size}. Change the block "
                         "size or set parallel.tp_sequence_parallel=false")
    if dims.dp > 1 and root.zero.stage < 2 and par.pp == 1:
        raise ValueError(
            f"parallel.tp={tp} with {dims.dp} data-parallel ranks needs zero.stage 2 or 3 (FSDP2 composes with "
            f"tensor-parallel DTensors on the data-parallel axis); got zero.stage={root.zero.stage}"
        )
    if root.moe.enabled:
        raise ValueError(f"parallel.tp={tp} with moe.num_experts={root.moe.num_experts}: MoE layers have no "
                         "tensor-parallel plan; shard experts with moe.ep_size instead")
    if root.precision.master_weights and dims.dp == 1:
        raise ValueError(f"parallel.tp={tp} with precision.master_weights=true is not supported; use precision=bf16 "
                         "(autocast over fp32 parameters)")
    if root.optimizer.impl in ("fused", "foreach"):
        raise ValueError(f"parallel.tp={tp} with optimizer.impl={root.optimizer.impl}: tensor-parallel and replicated "
                         "parameters cannot share one fused/foreach kernel; use optimizer.impl auto or for_loop")
    comp = root.compression
    enabled = [k for k, v in vars(comp).items() if getattr(v, "enabled", False)]
    if enabled:
        raise ValueError(f"parallel.tp={tp} with compression.{enabled[0]}.enabled=true is not supported "
                         "(masks and quantizers expect whole weights)")
    ltd = getattr(root.data_efficiency, "random_ltd", None)
    if ltd is not None and getattr(ltd, "enabled", False):
        raise ValueError(f"parallel.tp={tp} with data_efficiency.random_ltd.enabled=true is not supported yet")


def validate_recipe(cfg: RootConfig | DictConfig, dp_world_size: int | None = None) -> tuple[RootConfig, BatchSizes]:
    """Every check a training recipe needs; returns the typed config and the batch sizes.

    dp_world_size: the number of processes the run will have (default: the current process group's
    or WORLD_SIZE); the data-parallel size is derived from it and the `parallel` degrees.
    """
    root = to_root(cfg)
    validate_model_config(root.model)
    validate_data_config(root.data)
    if root.data.block_size > root.model.max_seq_len:
        raise ValueError(
            f"data.block_size={root.data.block_size} exceeds model.max_seq_len={root.model.max_seq_len}"
        )
    _choice("logger.wandb_mode", root.logger.wandb_mode, WANDB_MODES)
    validate_kernels_config(root.kernels)
    validate_activation_checkpoint_config(root.activation_checkpointing)
    validate_parallel_layout(root, dp_world_size or data_parallel_world_size())
    validate_moe_layout(root, dp_world_size or data_parallel_world_size())
    validate_data_efficiency_config(root.data_efficiency, root.model.n_layer, root.data.block_size,
                                    lr_scheduler_target=root.lr_scheduler._target_)
    validate_compression_recipe(root, dp_world_size or data_parallel_world_size())
    validate_sparse_attention_config(root.sparse_attention, root.model.n_head, root.data.block_size, root.model.dropout)
    batch = validate_engine_config(root, dp_world_size or data_parallel_world_size())
    return root, batch
