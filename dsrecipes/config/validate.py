"""Cross-field validation of a composed recipe, run once before any expensive work starts.

Each check raises ValueError naming the key, its value and what would be valid; schema-level
problems (unknown keys, wrong types) were already caught by Hydra/OmegaConf at composition.
Order: every numeric key against its range (dsrecipes.utils.ranges), the names that become paths
(name, checkpoint.dirname, compression.export_dirname), then each group and the cross-group rules.
Keys set in a group that is switched off are warned about (dsrecipes.config.inactive), not refused.
"""

from __future__ import annotations

import logging
import os
import warnings

from omegaconf import DictConfig, OmegaConf

from dsrecipes.compression.config import validate_compression_config
from dsrecipes.config.compatibility import check_compatibility
from dsrecipes.config.inactive import warn_inactive_keys
from dsrecipes.config.never_fires import warn_never_firing
from dsrecipes.config.nvme_checks import validate_nvme_recipe
from dsrecipes.config.schema import RootConfig, validate_kernels_config
from dsrecipes.data.config import validate_data_config
from dsrecipes.data_efficiency.config import validate_data_efficiency_config
from dsrecipes.distributed.activation_checkpoint import validate_activation_checkpoint_config
from dsrecipes.distributed.comms_config import validate_comms_logger_config
from dsrecipes.distributed.config import (
    check_launcher_backend,
    offloads,
    resolve_node_sized_keys,
    validate_launcher_config,
    validate_zero_config,
)
from dsrecipes.distributed.float8 import check_float8_compatibility, validate_float8_config
from dsrecipes.distributed.parallel_dims import ParallelDims, ranks_per_node
from dsrecipes.distributed.sequence_parallel import validate_sequence_parallel_recipe
from dsrecipes.distributed.torch_compile import validate_compile_config
from dsrecipes.models.config import validate_model_config
from dsrecipes.models.moe_config import validate_moe_config
from dsrecipes.models.sparse_attention import validate_sparse_attention_config
from dsrecipes.profiling.config import validate_profiling_config
from dsrecipes.training.batch import BatchSizes, resolve_batch_sizes
from dsrecipes.training.config import WandbMode
from dsrecipes.training.optim.lr_schedules import non_closed_form_target, validate_lr_scheduler_config
from dsrecipes.training.optim.optimizers import validate_optimizer_config
from dsrecipes.training.precision import resolve_auto_precision, validate_precision_config
from dsrecipes.utils.config_enum import enum_values
from dsrecipes.utils.device import resolve_device
from dsrecipes.utils.ranges import check_ranges

log = logging.getLogger("dsrecipes")

WANDB_MODES = enum_values(WandbMode)


def _choice(key: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def _positive(key: str, value, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}")


def check_run_name(name: str) -> None:
    """`name` ends the run directory's name and names the run in the loggers: a non-empty single path component."""
    if not str(name).strip():
        raise ValueError(f"name={name!r} is not valid; the run name ends the run directory's name and names the run "
                         "in the loggers, so it must not be empty (e.g. name=gpt)")
    if "/" in name or os.sep in name or name in (".", "..") or "\x00" in name:
        raise ValueError(f"name={name!r} is not valid; it must be a single file name (no '/', not '.' or '..'): it "
                         "becomes part of the run directory's name (set hydra.run.dir to choose the directory)")


def check_subdirectory(key: str, value: str) -> None:
    """A directory the run writes inside its run directory: a non-empty relative path that stays inside it."""
    parts = str(value).replace("\\", "/").split("/")
    if not str(value).strip() or os.path.isabs(value) or ".." in parts or all(p in ("", ".") for p in parts):
        raise ValueError(f"{key}={value!r} is not valid; it must be a relative directory name inside the run directory "
                         "(not empty, not absolute, no '..'), e.g. checkpoints")


def check_run_paths(root: RootConfig) -> None:
    """name, checkpoint.dirname and compression.export_dirname: what the run turns into paths of its run directory."""
    check_run_name(root.name)
    check_subdirectory("checkpoint.dirname", root.checkpoint.dirname)
    check_subdirectory("compression.export_dirname", root.compression.export_dirname)


def warn_fp16_on_cpu(root: RootConfig, device) -> None:
    """precision.dtype=fp16 on a CPU: it runs (torch autocasts to fp16 on the CPU and the loss scaler works), but it
    is no fast path there, so the run is told what it gets."""
    if root.precision.dtype == "fp16" and device.type == "cpu":
        warnings.warn(
            f"precision.dtype=fp16 on a CPU (trainer.device={root.trainer.device}): torch autocasts matmuls to fp16 on "
            "the CPU and the loss scaler runs as on a GPU, so training is correct, but most CPU kernels have no fast "
            "fp16 path (expect it several times slower than fp32). fp16 is for GPUs; on a CPU use precision=fp32 or bf16",
            stacklevel=3,
        )


def to_root(cfg: RootConfig | DictConfig) -> RootConfig:
    """A typed RootConfig object from a composed DictConfig (interpolations resolved)."""
    return OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg


def data_parallel_world_size() -> int:
    """World size the batch arithmetic uses: torch.distributed's, else WORLD_SIZE, else 1."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def parallel_dims(cfg: RootConfig, world_size: int, node_size: int | None = None) -> ParallelDims:
    """The run's layout: raises naming parallel.* / zero.* / moe.ep_size when the degrees do not fit the world size."""
    return ParallelDims.from_config(cfg, world_size, node_size=node_size)


def validate_engine_config(cfg: RootConfig, world_size: int) -> BatchSizes:
    """Checks of everything the Engine consumes; returns the resolved batch sizes.

    world_size is the number of processes; the batch triple uses the data-parallel part of it,
    world_size / (parallel.tp x parallel.sp x parallel.pp).
    """
    t = cfg.trainer
    resolve_node_sized_keys(cfg.zero, ranks_per_node(world_size))  # dsrecipes.initialize: `node` = LOCAL_WORLD_SIZE
    validate_zero_config(cfg.zero)
    dims = parallel_dims(cfg, world_size)
    from dsrecipes.distributed.config import check_zeropp_layout  # imported here: keeps the import block as it was

    check_zeropp_layout(cfg.zero, dims)  # ZeRO++ hpZ's group against the layout
    dp_world_size = dims.dp
    batch = resolve_batch_sizes(
        t.train_batch_size, t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps, dp_world_size
    )
    device = resolve_device(t.device)
    warn_fp16_on_cpu(cfg, device)
    validate_float8_config(cfg.fp8, device)  # fp8: CUDA >= 8.9 and torchao, before any work
    check_float8_compatibility(cfg, dims)
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
    if cfg.zero.stage > 0 and dp_world_size == 1 and not dims.model_parallel and not offloads(cfg.zero):
        warnings.warn(
            f"zero.stage={cfg.zero.stage} with a data-parallel world size of 1: there is nothing to shard, "
            "the run trains as stage 0",
            stacklevel=2,
        )
    return batch


def validate_pipeline_values(root: RootConfig, dims: ParallelDims) -> None:
    """parallel.pp > 1: schedule, partition, stages vs blocks, micro-batches vs stages."""
    from dsrecipes.distributed.pipeline_parallel import PP_PARTITIONS, PP_SCHEDULES

    par, t = root.parallel, root.trainer
    _choice("parallel.pp_schedule", par.pp_schedule, PP_SCHEDULES)
    _choice("parallel.pp_partition", par.pp_partition, PP_PARTITIONS)
    validate_pipeline_stages(root)
    gas = resolve_batch_sizes(t.train_batch_size, t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps,
                              dims.dp).gradient_accumulation_steps
    if gas < par.pp:
        raise ValueError(f"parallel.pp={par.pp} needs at least {par.pp} micro-batches per step (micro-batches = "
                         f"trainer.gradient_accumulation_steps, as in DeepSpeed); got {gas}")
    if par.pp_schedule == "interleaved_1f1b" and gas % par.pp:
        raise ValueError(f"parallel.pp_schedule=interleaved_1f1b needs micro-batches (gradient_accumulation_steps={gas}) "
                         f"divisible by parallel.pp={par.pp}")


def validate_pipeline_stages(root: RootConfig) -> None:
    """parallel.pp x the schedule's stages per rank must not exceed the model's blocks."""
    from dsrecipes.distributed.pipeline_parallel import stages_per_rank

    par = root.parallel
    stages = par.pp * stages_per_rank(par.pp_schedule)
    if root.model.n_layer < stages:
        raise ValueError(f"parallel.pp={par.pp} with pp_schedule={par.pp_schedule} makes {stages} stages, more than "
                         f"model.n_layer={root.model.n_layer} blocks")


def validate_tensor_parallel_values(root: RootConfig, tp: int) -> None:
    """parallel.tp > 1: whole heads and equal MLP shards per rank, equal sequence shards."""
    model = root.model
    for key, value in (("model.n_head", model.n_head), ("model.n_kv_head", model.kv_heads), ("model.d_ff", model.ffn_dim)):
        if value % tp:
            raise ValueError(f"parallel.tp={tp} does not divide {key}={value}: "
                             "every rank must hold whole heads / equal MLP shards")
    if root.parallel.tp_sequence_parallel and root.data.block_size % tp:
        raise ValueError(f"parallel.tp={tp} with parallel.tp_sequence_parallel=true needs data.block_size divisible by "
                         f"{tp} (equal sequence shards); got data.block_size={root.data.block_size}. Change the block "
                         "size or set parallel.tp_sequence_parallel=false")


def validate_parallel_values(root: RootConfig, dims: ParallelDims) -> None:
    """Model-parallel degrees against the model and the data (what composes is dsrecipes.config.compatibility's)."""
    if dims.pp > 1:
        validate_pipeline_values(root, dims)
    if dims.sp > 1:
        validate_sequence_parallel_recipe(root)
    if dims.tp > 1:
        validate_tensor_parallel_values(root, dims.tp)


def validate_recipe(cfg: RootConfig | DictConfig, dp_world_size: int | None = None,
                    node_size: int | None = None) -> tuple[RootConfig, BatchSizes]:
    """Every check a training recipe needs; returns the typed config and the batch sizes.

    dp_world_size: the number of processes the run will have (default: the current process group's
    or WORLD_SIZE); the data-parallel size is derived from it and the `parallel` degrees.
    node_size: processes per node (default: LOCAL_WORLD_SIZE, else the whole world is one node); the
    `node` values of zero.hybrid_shard_size / zero.zero_hpz_partition_size become this number.
    """
    root = to_root(cfg)
    world = dp_world_size or data_parallel_world_size()
    node_size = node_size or ranks_per_node(world)
    for line in resolve_node_sized_keys(root.zero, node_size):
        log.info(line)
    device = resolve_device(root.trainer.device)
    auto_precision = resolve_auto_precision(root.precision, device)
    if auto_precision:
        log.info(auto_precision)
    check_ranges(root)
    check_run_paths(root)
    validate_model_config(root.model)
    validate_data_config(root.data)
    if root.data.block_size > root.model.max_seq_len:
        raise ValueError(
            f"data.block_size={root.data.block_size} exceeds model.max_seq_len={root.model.max_seq_len}"
        )
    _choice("logger.wandb_mode", root.logger.wandb_mode, WANDB_MODES)
    validate_kernels_config(root.kernels)
    validate_activation_checkpoint_config(root.activation_checkpointing)
    validate_compile_config(root.compile, device.type)
    validate_launcher_config(root.launcher)
    check_launcher_backend(root.launcher, world)
    dims = parallel_dims(root, world, node_size)
    for message in dims.node_warnings():
        warnings.warn(message, stacklevel=2)
    validate_parallel_values(root, dims)
    validate_moe_config(root.moe, root.model, world)
    validate_data_efficiency_config(root.data_efficiency, root.model.n_layer, root.data.block_size,
                                    lr_scheduler_target=non_closed_form_target(root.lr_scheduler))
    validate_compression_config(root.compression, n_head=root.model.n_head, n_layer=root.model.n_layer)
    validate_sparse_attention_config(root.sparse_attention, root.model.n_head, root.data.block_size, root.model.dropout)
    validate_profiling_config(root.flops_profiler, root.profiler, root.trainer.max_steps)
    validate_comms_logger_config(root.comms_logger)
    check_compatibility(root, dims)
    validate_nvme_recipe(root, dims)
    batch = validate_engine_config(root, world)
    warn_inactive_keys(root)
    warn_never_firing(root)
    return root, batch
