"""The model-parallel degrees against the model and the data: pipeline stages vs blocks and micro-batches, whole
heads per tensor-parallel rank, equal sequence shards. Which layouts compose at all is
dsrecipes.config.compatibility's; these are the values a layout that composes still needs.
"""

from __future__ import annotations

from typing import Any

from dsrecipes.distributed.parallel_dims import ParallelDims
from dsrecipes.distributed.sequence_parallel import validate_sequence_parallel_recipe
from dsrecipes.utils.config_enum import check_choice


def validate_pipeline_values(root: Any, dims: ParallelDims, gradient_accumulation_steps: int) -> None:
    """parallel.pp > 1: schedule, partition, stages vs blocks, micro-batches vs stages."""
    from dsrecipes.distributed.pipeline_parallel import PP_PARTITIONS, PP_SCHEDULES

    par = root.parallel
    check_choice("parallel.pp_schedule", par.pp_schedule, PP_SCHEDULES)
    check_choice("parallel.pp_partition", par.pp_partition, PP_PARTITIONS)
    validate_pipeline_stages(root)
    gas = gradient_accumulation_steps
    if gas < par.pp:
        raise ValueError(f"parallel.pp={par.pp} needs at least {par.pp} micro-batches per step (micro-batches = "
                         f"trainer.gradient_accumulation_steps, as in DeepSpeed); got {gas}")
    if par.pp_schedule == "interleaved_1f1b" and gas % par.pp:
        raise ValueError(f"parallel.pp_schedule=interleaved_1f1b needs micro-batches (gradient_accumulation_steps={gas}) "
                         f"divisible by parallel.pp={par.pp}")


def validate_pipeline_stages(root: Any) -> None:
    """parallel.pp x the schedule's stages per rank must not exceed the model's blocks."""
    from dsrecipes.distributed.pipeline_parallel import stages_per_rank

    par = root.parallel
    stages = par.pp * stages_per_rank(par.pp_schedule)
    if root.model.n_layer < stages:
        raise ValueError(f"parallel.pp={par.pp} with pp_schedule={par.pp_schedule} makes {stages} stages, more than "
                         f"model.n_layer={root.model.n_layer} blocks")


def validate_tensor_parallel_values(root: Any, tp: int) -> None:
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


def validate_parallel_values(root: Any, dims: ParallelDims, gradient_accumulation_steps: int) -> None:
    """Model-parallel degrees against the model and the data; gradient_accumulation_steps (the micro-batches per
    step) is read when parallel.pp > 1."""
    if dims.pp > 1:
        validate_pipeline_values(root, dims, gradient_accumulation_steps)
    if dims.sp > 1:
        validate_sequence_parallel_recipe(root)
    if dims.tp > 1:
        validate_tensor_parallel_values(root, dims.tp)


def validate_model_split(root: Any, dims: ParallelDims) -> None:
    """What decides how the model's parameters split over the ranks: whole heads and equal MLP shards per
    tensor-parallel rank, no more pipeline stages than blocks (the memory estimator's check; the micro-batch and
    sequence checks of validate_parallel_values do not change what a rank holds)."""
    if dims.tp > 1:
        validate_tensor_parallel_values(root, dims.tp)
    if dims.pp > 1:
        validate_pipeline_stages(root)
