"""DeepSpeed's `zero_optimization` block -> the `zero` group.

Mapped: stage, offload_optimizer / offload_param (device cpu or nvme; also the deprecated cpu_offload
and cpu_offload_param flags; NVMe's nvme_path, buffer_count, buffer_size and pin_memory onto zero.nvme_path,
zero.buffer_count / zero.param_buffer_count, zero.buffer_size, zero.pin_memory; the top-level `aio`
block onto zero.aio in top_level.py), and ZeRO++ onto the same-named zero keys: zero_quantized_weights (qwZ),
zero_quantized_gradients (qgZ; dsrecipes quantizes to int8 by default, DeepSpeed to int4:
zero.zero_quantized_gradients_bits=4 matches it) and zero_hpz_partition_size (hpZ, > 1: FSDP2's
secondary partition, reshard_after_forward=<size>; 0 and 1 are DeepSpeed's "off"). Refused: two
different nvme_path values (dsrecipes has one swap directory), aio.use_gds, quantized frozen
weights (zero_quantized_nontrainable_weights), ZenFlow's asynchronous updates, and the keys
DeepSpeed 0.19.7 removed (MiCS, LoCo). Every other key is a speed or memory knob of
DeepSpeed's own partitioner (buckets, overlap, prefetching, persistence thresholds): accepted, no
effect, since FSDP2 and ZeroRedundancyOptimizer do their own bucketing. "auto" bucket sizes (Hugging Face fills
reduce_bucket_size with hidden_size^2, stage3_prefetch_bucket_size with 0.9 hidden_size^2,
stage3_param_persistence_threshold with 10 hidden_size) have no effect either.
"""

from __future__ import annotations

from typing import Any

from dsrecipes.config.ds_import.rules import Custom, NoEffect, RefuseUnless, Rule, Sub, To, apply_table, one_of
from dsrecipes.config.ds_import.translation import Translation

_BUCKETS = NoEffect("a bucket size of DeepSpeed's partitioner; FSDP2 / ZeroRedundancyOptimizer bucket on their own")
_SPEED = NoEffect("a speed / memory option of DeepSpeed's ZeRO implementation; no counterpart in FSDP2")
_STAGE3 = NoEffect("a ZeRO-3 prefetch / persistence knob of DeepSpeed's partitioner; FSDP2 gathers each block's "
                   "parameters as a unit and prefetches the next one")
_SAVE16 = NoEffect("dsrecipes always exports a consolidated model at the end (checkpoint.export_safetensors) and its "
                   "sharded checkpoints load at any world size")
_OFFLOAD_SPEED = NoEffect("a speed option of DeepSpeed's offload engine")
_FLAG = one_of("the value", {True: True, False: False})
_PIPELINED = NoEffect("dsrecipes' NVMe optimizer always reads the next swap unit and writes the previous one while a "
                      "unit steps (zero.aio.overlap_events=false turns the overlap off)")


def _offload_device(kind: str) -> Rule:
    return To(f"zero.offload_{kind}", one_of("device", {"none": "none", "cpu": "cpu", "nvme": "nvme", None: "none"}))


def _count(value: Any) -> int:
    """A positive element or buffer count; DeepSpeed configs often write 1e8 (a float in JSON)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError("must be a positive integer")
    return value


def _nvme_path(t: Translation, key: str, value: Any) -> None:
    if value is None:
        t.ignored(key, value, "not set")
        return
    if not isinstance(value, str):
        t.refused(key, value, "must be a directory path")
        return
    earlier = t.get("zero.nvme_path")
    if earlier is not None and earlier != value:
        t.refused(key, value, f"differs from the other offload block's nvme_path ({earlier}); dsrecipes keeps every "
                  "swap file in one directory, zero.nvme_path")
        return
    t.mapped(key, value, "zero.nvme_path", value)


OFFLOAD_OPTIMIZER_TABLE: dict[str, Rule] = {
    "device": _offload_device("optimizer"), "nvme_path": Custom(_nvme_path),
    "buffer_count": To("zero.buffer_count", _count), "pin_memory": To("zero.pin_memory", _FLAG),
    "pipeline_read": _PIPELINED, "pipeline_write": _PIPELINED,
    "fast_init": NoEffect("the swap file is preallocated with posix_fallocate; nothing else to initialise"),
    "ratio": NoEffect("partial offload (Twin-Flow) splits where the optimizer step runs, not what it computes; "
                      "dsrecipes offloads the whole step"),
    "super_offload": _OFFLOAD_SPEED, "cpuadam_cores_perc": _OFFLOAD_SPEED,
}
OFFLOAD_PARAM_TABLE: dict[str, Rule] = {
    "device": _offload_device("param"), "nvme_path": Custom(_nvme_path),
    "buffer_count": To("zero.param_buffer_count", _count), "buffer_size": To("zero.buffer_size", _count),
    "max_in_cpu": NoEffect("dsrecipes keeps no host cache of swapped parameters beyond the units in use and the "
                           "zero.param_buffer_count x zero.buffer_size pool"),
    "pin_memory": To("zero.pin_memory", _FLAG),
}


AIO_TABLE: dict[str, Rule] = {  # DeepSpeed's top-level `aio` block (swap_tensor/aio_config.py)
    "block_size": To("zero.aio.block_size", _count), "queue_depth": To("zero.aio.queue_depth", _count),
    "intra_op_parallelism": To("zero.aio.thread_count", _count, note="the I/O engine's threads"),
    "thread_count": To("zero.aio.thread_count", _count, note="older DeepSpeed spelling of intra_op_parallelism"),
    "single_submit": To("zero.aio.single_submit", _FLAG), "overlap_events": To("zero.aio.overlap_events", _FLAG),
    "use_gds": RefuseUnless("GPUDirect Storage is not used: dsrecipes' swap files move through host buffers"),
}


def _stage(value: Any) -> int:
    if isinstance(value, bool) or value not in (0, 1, 2, 3):
        raise ValueError("DeepSpeed's ZeRO stages are 0, 1, 2 and 3")
    return value


def _hpz(t: Translation, key: str, value: Any) -> None:
    if value in (0, 1) and not isinstance(value, bool):
        t.ignored(key, value, "DeepSpeed's default: no secondary partition")
    elif isinstance(value, int) and not isinstance(value, bool) and value > 1:
        t.mapped(key, value, "zero.zero_hpz_partition_size", value,
                 "hpZ: FSDP2 keeps a secondary parameter partition within groups of this many ranks after forward")
    else:
        t.refused(key, value, "must be a non-negative integer")


_ZEROPP_FLAG = _FLAG


def _legacy_offload(kind: str) -> Rule:
    def read(t: Translation, key: str, value: Any) -> None:
        if value is True:
            t.mapped(key, value, f"zero.offload_{kind}", "cpu", "deprecated flag")
        elif value in (False, None):
            t.ignored(key, value, "off")
        else:
            t.refused(key, value, "must be true or false")

    return Custom(read)


_REMOVED = "removed in DeepSpeed 0.19.7"
ZERO_TABLE: dict[str, Rule] = {
    "stage": To("zero.stage", _stage, default=0),
    "offload_optimizer": Sub(OFFLOAD_OPTIMIZER_TABLE, "zero_optimization.offload_optimizer"),
    "offload_param": Sub(OFFLOAD_PARAM_TABLE, "zero_optimization.offload_param"),
    "cpu_offload": _legacy_offload("optimizer"),
    "cpu_offload_param": _legacy_offload("param"),
    "cpu_offload_use_pin_memory": _OFFLOAD_SPEED,
    "zero_hpz_partition_size": Custom(_hpz),
    "zero_quantized_weights": To("zero.zero_quantized_weights", _ZEROPP_FLAG,
                                 note="qwZ: blockwise int8 all-gather of the parameter shards"),
    "zero_quantized_nontrainable_weights": RefuseUnless("storing frozen weights quantized changes the numerics; "
                                                        "dsrecipes keeps them in the parameter dtype"),
    "zero_quantized_gradients": To("zero.zero_quantized_gradients", _ZEROPP_FLAG,
                                   note="qgZ: quantized all-to-all gradient reduce-scatter, int8 "
                                        "(zero.zero_quantized_gradients_bits=4 for DeepSpeed's int4)"),
    "zenflow": RefuseUnless("ZenFlow applies low-priority gradient updates asynchronously (stale), which changes the "
                            "training; dsrecipes steps every parameter at every step"),
    "mics_shard_size": RefuseUnless(f"MiCS was {_REMOVED}; its layout is dsrecipes' zero.hybrid_shard_size (shard "
                                    "within groups, replicate across)", ok=(-1, None)),
    "mics_hierarchical_params_gather": RefuseUnless(f"MiCS was {_REMOVED}"),
    "zeropp_loco_param": RefuseUnless(f"LoCo error feedback changes the numerics and was {_REMOVED}", ok=(None,)),
    "compute_grad_norm": NoEffect("dsrecipes always computes the gradient norm (train/grad_norm); DeepSpeed needs "
                                  "gradient_clipping=0 to turn it off, so clipping is unaffected"),
    "contiguous_gradients": _SPEED, "reduce_scatter": _SPEED, "reduce_bucket_size": _BUCKETS,
    "use_multi_rank_bucket_allreduce": _SPEED, "allgather_partitions": _SPEED, "allgather_bucket_size": _BUCKETS,
    "overlap_comm": _SPEED, "load_from_fp32_weights": NoEffect("dsrecipes' checkpoints always hold the fp32 master "
                                                                "weights and load them"),
    "elastic_checkpoint": NoEffect("dsrecipes' sharded checkpoints load at any world size"),
    "sub_group_size": _SPEED, "round_robin_gradients": _SPEED, "legacy_stage1": _SPEED,
    "ignore_unused_parameters": NoEffect("FSDP2 / DDP in dsrecipes handle parameters without gradients"),
    "parameter_alignment": _SPEED, "memory_efficient_linear": _SPEED, "pipeline_loading_checkpoint": _SPEED,
    "override_module_apply": _SPEED, "log_trace_cache_warnings": NoEffect("a debugging log option"),
    "enable_sanity_checks": NoEffect("a debugging option"), "save_muon_momentum_buffer_in_memory": _SPEED,
    "leaf_module": _STAGE3,
    **{key: _STAGE3 for name in ("prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
                                 "max_live_parameters", "max_reuse_distance", "module_granularity_threshold",
                                 "use_all_reduce_for_fetch_params", "allgather_sequential")
       for key in (name, f"stage3_{name}")},
    "gather_16bit_weights_on_model_save": _SAVE16, "stage3_gather_16bit_weights_on_model_save": _SAVE16,
    "stage3_gather_fp16_weights_on_model_save": _SAVE16,
}


def read_zero(t: Translation, key: str, value: Any) -> None:
    """zero_optimization: a block, or the legacy boolean (true = stage 1)."""
    if isinstance(value, bool):
        t.mapped(key, value, "zero.stage", 1 if value else 0, "legacy boolean form")
    elif isinstance(value, dict):
        apply_table(t, key, value, ZERO_TABLE, "zero_optimization")
    else:
        t.refused(key, value, "must be a block (a JSON object) or a boolean")
