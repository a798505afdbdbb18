"""The table of DeepSpeed's top-level keys, and of the small blocks (monitors, checkpointing, parallelism ...).

Every key DeepSpeed 0.19 reads at the top level is listed here with its fate; the bigger blocks
have files of their own (zero, precision and batch, optimizer and scheduler, data_efficiency,
compression and sparse attention). Keys DeepSpeed 0.19.7 removed are still known: those dsrecipes
implements (compression_training, sparse_attention, the legacy curriculum_learning) are read as
0.19.6 read them; the others are refused when they would change the training, with the reason.

What "no effect" means here: a key that only changes speed, memory or log output in DeepSpeed
(bucket sizes, timers, profilers, log destinations), or that dsrecipes does anyway. The flops
profiler block maps onto the flops_profiler group and wall_clock_breakdown onto
trainer.wall_clock_breakdown (dsrecipes.profiling); the comms_logger block onto the comms_logger group
(dsrecipes.distributed.comms_logger).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsrecipes.config.ds_import.data_efficiency import DATA_EFFICIENCY_RULE, LEGACY_CURRICULUM_RULE
from dsrecipes.config.ds_import.model_blocks import COMPRESSION_RULE, SPARSE_ATTENTION_TABLE
from dsrecipes.config.ds_import.optimizer import OPTIMIZER_RULE, SCHEDULER_RULE
from dsrecipes.config.ds_import.precision import BATCH_KEYS, PRECISION_BLOCKS
from dsrecipes.config.ds_import.rules import (
    Custom,
    Handled,
    NoEffect,
    RefuseUnless,
    Rule,
    Sub,
    To,
    one_of,
    positive_int,
    refused_when_on,
)
from dsrecipes.config.ds_import.translation import Translation
from dsrecipes.config.ds_import.zero import AIO_TABLE, read_zero
from dsrecipes.distributed.comms_config import COMM_OPS, canonical_op

_LOG = NoEffect("a log / timing option; dsrecipes logs its own metrics (train/*, perf/*, mem/*)")
_RUN_DIR = NoEffect("dsrecipes writes into the run directory (outputs/<date>/<time>_<name>/)")
_CHECKPOINT_IO = NoEffect("dsrecipes writes its checkpoints with torch.distributed.checkpoint / torch.save")
_LOG_LEVELS = {name: name.upper() for name in ("debug", "info", "warning", "error", "critical")} | \
              {name.upper(): name.upper() for name in ("debug", "info", "warning", "error", "critical")} | \
              {"warn": "WARNING", "WARN": "WARNING"}


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError("must be a number >= 0")
    return float(value)


def _pipeline_checkpointing(t: Translation, key: str, value: Any) -> None:
    """DeepSpeed checkpoints the pipeline's layers in chunks of k (k > 0): every layer is recomputed."""
    if value in (0, None):
        t.ignored(key, value, "0: no activation checkpointing")
    elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
        t.mapped(key, value, "activation_checkpointing.mode", "full", "every block recomputed, as with DeepSpeed's "
                                                                      "chunks of k layers")
    else:
        t.refused(key, value, "must be an integer >= 0")


# DeepSpeed 0.19.8's CompileConfig fields (compile/config.py); its pydantic model forbids any other key
COMPILE_KEYS = ("deepcompile", "autoep_non_moe", "free_activation", "free_activation_threshold", "offload_activation",
                "offload_activation_pin_memory", "offload_opt_states", "double_buffer", "symmetric_memory", "debug_log",
                "offload_parameters", "sync_before_reduce", "sync_after_reduce", "sync_before_allgather",
                "sync_after_allgather", "keep_int_input_tensors", "keep_all_input_tensors", "passes")


def _compile_block(t: Translation, key: str, value: Any) -> None:
    """DeepSpeed's `compile` block: DeepCompile (deepcompile: true) is refused; a key its CompileConfig does not
    have is refused as DeepSpeed refuses it (axolotl's `disable` / `backend` are torch.compile's, not DeepSpeed's)."""
    if not isinstance(value, Mapping):
        t.refused(key, value, "DeepSpeed's compile is a block (a JSON object)")
        return
    for name, v in value.items():
        path = f"{key}.{name}"
        if name not in COMPILE_KEYS:
            t.refused(path, v, "not a key of DeepSpeed's compile block: DeepSpeed refuses the config too (its "
                               f"CompileConfig forbids extra keys; valid: {', '.join(COMPILE_KEYS)}); dsrecipes' "
                               "torch.compile is the compile group (compile=blocks)")
        elif name == "deepcompile" and v is True:
            t.refused(path, v, "DeepCompile is not supported")
        else:
            t.ignored(path, v, "an option of DeepSpeed's compiler passes")


TENSORBOARD_TABLE: dict[str, Rule] = {
    "enabled": To("logger.tensorboard", default=False), "output_path": NoEffect("events go to <run dir>/tb/"),
    "job_name": NoEffect("the run is named by `name` (the run directory and the loggers)"),
}
WANDB_TABLE: dict[str, Rule] = {
    "enabled": To("logger.wandb", default=False), "project": To("logger.wandb_project", default="deepspeed"),
    "team": To("logger.wandb_entity"), "group": To("logger.wandb_group"),
}
CSV_TABLE: dict[str, Rule] = {
    "enabled": To("logger.jsonl", default=False, note="every logged metric per step in metrics.jsonl: JSON lines, "
                                                      "not CSV"),
    "output_path": NoEffect("metrics.jsonl goes to the run directory"),
    "job_name": NoEffect("the run is named by `name`"),
}
COMET_TABLE: dict[str, Rule] = {key: NoEffect("no Comet logger in dsrecipes (TensorBoard, W&B, metrics.jsonl); "
                                               "the training is unaffected")
                                for key in ("enabled", "samples_log_interval", "project", "workspace", "api_key",
                                            "experiment_name", "experiment_key", "online", "mode")}
def _profile_step(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("must be an integer >= 0 (the global step at which the profiled step starts)")
    return value


def _module_depth(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ValueError("must be an integer >= -1 (-1: every level)")
    return value


def _prof_ops(value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError("must be a list of op names")
    unknown = [v for v in value if canonical_op(v) not in COMM_OPS]
    if unknown:
        raise ValueError(f"unknown op name(s) {unknown}; valid: {', '.join(COMM_OPS)}")
    return list(value)


FLOPS_PROFILER_TABLE: dict[str, Rule] = {  # DeepSpeed's defaults (profiling/constants.py) when the block leaves one out
    "enabled": To("flops_profiler.enabled", default=False),
    "recompute_fwd_factor": To("flops_profiler.recompute_fwd_factor", _float, default=0.0,
                               note="reported beside the measured backward FLOPs (recomputation included)"),
    "profile_step": To("flops_profiler.profile_step", _profile_step, default=1),
    "module_depth": To("flops_profiler.module_depth", _module_depth, default=-1),
    "top_modules": To("flops_profiler.top_modules", positive_int, default=1),
    "detailed": To("flops_profiler.detailed", default=True),
    "output_file": To("flops_profiler.output_file", default=None,
                      note="Markdown there (a relative path inside the run directory) and JSON beside it; DeepSpeed "
                           "writes text, and to stdout when null (dsrecipes: <run dir>/flops_profile.md)"),
}
COMMS_LOGGER_TABLE: dict[str, Rule] = {  # DeepSpeed's defaults (comm/constants.py) when the block leaves one out
    "enabled": To("comms_logger.enabled", default=False),
    "verbose": To("comms_logger.verbose", default=False),
    "prof_all": To("comms_logger.prof_all", default=True),
    "debug": To("comms_logger.debug", default=False,
                note="the caller's name is appended to each op's record, as DeepSpeed's '| [Caller Func: f]'"),
    "prof_ops": To("comms_logger.prof_ops", _prof_ops, default=[]),
}
ACTIVATION_CHECKPOINTING_TABLE: dict[str, Rule] = {
    "partition_activations": NoEffect("splits saved activations across model-parallel ranks: a memory option"),
    "cpu_checkpointing": To("activation_checkpointing.cpu_offload",
                            note="for the blocks activation_checkpointing.mode checkpoints: DeepSpeed's block turns "
                                 "no checkpointing on, choose activation_checkpointing=full or every_k"),
    "contiguous_memory_optimization": NoEffect("a memory layout option"),
    "number_checkpoints": NoEffect("sizes the contiguous buffer of contiguous_memory_optimization"),
    "synchronize_checkpoint_boundary": NoEffect("a device synchronisation for timing"),
    "profile": _LOG,
}
CHECKPOINT_TABLE: dict[str, Rule] = {
    "tag_validation": NoEffect("dsrecipes names its checkpoints step_N on every rank alike"),
    "load_universal": NoEffect("dsrecipes' sharded checkpoints load at any world size"),
    "use_node_local_storage": _CHECKPOINT_IO, "parallel_write": _CHECKPOINT_IO,
    "checkpoint_serialization": _CHECKPOINT_IO, "writer": _CHECKPOINT_IO,
}
DATA_TYPES_TABLE: dict[str, Rule] = {
    "grad_accum_dtype": NoEffect("dsrecipes' data-parallel strategies reduce and keep gradients for the fp32 master "
                                 "weights in fp32"),
    "param_dtype": RefuseUnless("a separate parameter dtype; dsrecipes takes it from precision (dtype, master_weights)",
                                ok=(None,)),
    "buffer_dtype": RefuseUnless("a separate buffer dtype is not supported", ok=(None,)),
    "keep_in_fp32_modules": RefuseUnless("dsrecipes keeps norms and losses in fp32 under autocast; a module list is "
                                         "not supported", ok=("auto", None)),
}
PIPELINE_TABLE: dict[str, Rule] = {
    "stages": To("parallel.pp", positive_int, auto_why="the PipelineModule's num_stages"),
    "partition": To("parallel.pp_partition", one_of("partition", {"uniform": "uniform", "parameters": "parameters"})),
    "seed_layers": NoEffect("dsrecipes' GPT seeds its blocks the same way at every layout"),
    "activation_checkpoint_interval": Custom(_pipeline_checkpointing),
    "pipe_partitioned": NoEffect("a communication option of DeepSpeed's pipeline engine"),
    "grad_partitioned": NoEffect("a communication option of DeepSpeed's pipeline engine"),
}
_TP_NONE = NoEffect("dsrecipes shards its GPT's attention, MLP, embedding and LM head itself (Megatron layout)")
TENSOR_PARALLEL_TABLE: dict[str, Rule] = {
    "autotp_size": Custom(lambda t, key, value: t.ignored(key, value, "0: no tensor parallelism")
                          if value == 0 else To("parallel.tp", positive_int).apply(t, key, value)),
    "dtype": NoEffect("the precision group sets the dtype"), "tp_overlap_comm": _TP_NONE,
    "vocab_parallel_lm_head": _TP_NONE, "vocab_parallel_ce_backend": _TP_NONE, "tensor_parallel": _TP_NONE,
    "tp": _TP_NONE, "injection_policy_tuple": _TP_NONE, "partition_config": _TP_NONE, "preset_model": _TP_NONE,
    "keep_module_on_host": _TP_NONE, "replace_with_kernel_inject": _TP_NONE, "kernel_inject": _TP_NONE,
}
_EP_NONE = NoEffect("AutoEP rewrites a Hugging Face model's MoE layers; dsrecipes' GPT has its own (the moe group)")
EXPERT_PARALLEL_TABLE: dict[str, Rule] = {
    "enabled": NoEffect("expert parallelism is on whenever moe.ep_size > 1"),
    "autoep_size": To("moe.ep_size", positive_int),
    "top_k": To("moe.k", positive_int, auto_why="the model's own top-k"),
    "load_balance_coeff": To("moe.aux_loss_coef"),
    **{key: _EP_NONE for key in (
        "expert_tensor_parallel_size", "validate_folding_routing", "async_split_plan", "preset_model",
        "moe_layer_pattern", "expert_pattern", "router_pattern", "use_grouped_mm", "disable_triton_grouped_mm",
        "route_norm", "route_scale", "score_apply", "combine_impl", "row_weighting_impl", "gate_up_impl",
        "comm_backend", "comm_num_sm", "comm_qp_margin", "comm_max_tokens_per_rank", "num_expert_groups",
        "num_limited_groups", "score_func")},
}
_REMOVED = "removed in DeepSpeed 0.19.7"
def _off_unless_enabled(why: str) -> Rule:
    """A block refused when `enabled` is true, accepted (no effect) when it is off."""
    return refused_when_on(why, "the block is not enabled")


_GONE = {
    "elasticity": _off_unless_enabled(f"elastic training rewrites the batch triple per world size ({_REMOVED}); set "
                                      "the batch keys"),
    "progressive_layer_drop": _off_unless_enabled(f"progressive layer dropping changes the training and is not "
                                                  f"supported ({_REMOVED})"),
    "eigenvalue": _off_unless_enabled(f"eigenvalue-based MoQ is not supported ({_REMOVED})"),
    "quantize_training": _off_unless_enabled(f"MoQ (quantize_training) is not supported ({_REMOVED}); use "
                                             "compression.weight_quantization"),
    "sparse_gradients": RefuseUnless(f"sparse embedding gradients are not supported ({_REMOVED})"),
    "graph_harvesting": RefuseUnless(f"CUDA-graph harvesting is not supported ({_REMOVED})"),
}


TOP_LEVEL: dict[str, Rule] = {
    **{key: Handled() for key in (*BATCH_KEYS, *PRECISION_BLOCKS)},
    "gradient_clipping": To("trainer.gradient_clipping", _float, auto_why="TrainingArguments.max_grad_norm"),
    "steps_per_print": NoEffect("DeepSpeed's console progress line only (its monitors write every step); dsrecipes "
                                "logs to the console and the metric sinks every trainer.log_interval steps"),
    "optimizer": OPTIMIZER_RULE,
    "scheduler": SCHEDULER_RULE,
    "zero_optimization": Custom(read_zero),
    "zero_allow_untested_optimizer": NoEffect("dsrecipes shards any optimizer the same way"),
    "zero_force_ds_cpu_optimizer": NoEffect("with CPU offload the configured optimizer steps on the CPU (FSDP2's "
                                            "CPUOffloadPolicy)"),
    "activation_checkpointing": Sub(ACTIVATION_CHECKPOINTING_TABLE, "activation_checkpointing"),
    "tensorboard": Sub(TENSORBOARD_TABLE, "tensorboard"),
    "wandb": Sub(WANDB_TABLE, "wandb"),
    "csv_monitor": Sub(CSV_TABLE, "csv_monitor"),
    "comet": Sub(COMET_TABLE, "comet"),
    "flops_profiler": Sub(FLOPS_PROFILER_TABLE, "flops_profiler"),
    "comms_logger": Sub(COMMS_LOGGER_TABLE, "comms_logger"),
    "autotuning": NoEffect("a launcher feature (deepspeed --autotuning); dsrecipes sweeps with -m"),
    "wall_clock_breakdown": To("trainer.wall_clock_breakdown",
                               note="perf/{data,forward,backward,grad_reduce,optimizer}_s per log interval; not forced "
                                    "on by flops_profiler.enabled as in DeepSpeed"),
    "memory_breakdown": _LOG, "dump_state": _LOG, "timers": _LOG,
    "log_level": To("logger.level", one_of("log_level", _LOG_LEVELS)),
    "disable_python_gc": NoEffect("a speed option"),
    "vocabulary_size": NoEffect("DeepSpeed only warns when it is not a multiple of 8; the model sets the vocabulary"),
    "checkpoint": Sub(CHECKPOINT_TABLE, "checkpoint"),
    "datastates": _CHECKPOINT_IO, "nebula": _CHECKPOINT_IO, "aio": Sub(AIO_TABLE, "aio"),
    "data_types": Sub(DATA_TYPES_TABLE, "data_types"),
    "dataloader_drop_last": To("trainer.dataloader_drop_last",
                               note="the DataLoader dsrecipes.initialize(training_data=...) returns"),
    "prescale_gradients": NoEffect("divides before instead of after the reduction: the same mean"),
    "gradient_predivide_factor": NoEffect("splits the division around the reduction: the same mean"),
    "gradient_allreduce_op": RefuseUnless("dsrecipes averages gradients over data-parallel ranks; a sum changes their "
                                          "scale", ok=("mean",), ok_why="what dsrecipes does"),
    "communication_data_type": NoEffect("dsrecipes reduces gradients in fp32 (more precise, not faster)"),
    "seq_parallel_communication_data_type": NoEffect("dsrecipes' Ulysses all-to-alls run in the activations' dtype"),
    "disable_allgather": NoEffect("a communication option"),
    "managed_gradient_accumulation": RefuseUnless("client-owned accumulation (every step() a boundary) is not "
                                                  "supported; set gradient_accumulation_steps", ok=(True,),
                                                  ok_why="DeepSpeed's default, what dsrecipes does"),
    "use_data_before_expert_parallelism": NoEffect("the order of ranks in the mesh, not what they compute"),
    "hybrid_engine": _off_unless_enabled("the RLHF hybrid engine is not supported"),
    "compile": Custom(_compile_block, kind="refused"),
    "weight_quantization": RefuseUnless("quantized weights at zero.Init change the model; use "
                                        "compression.weight_quantization", ok=(None,)),
    "sequence_parallel_size": To("parallel.sp", positive_int),
    "tensor_parallel": Sub(TENSOR_PARALLEL_TABLE, "tensor_parallel"),
    "expert_parallel": Sub(EXPERT_PARALLEL_TABLE, "expert_parallel"),
    "pipeline": Sub(PIPELINE_TABLE, "pipeline"),
    "sparse_attention": Sub(SPARSE_ATTENTION_TABLE, "sparse_attention"),
    "data_efficiency": DATA_EFFICIENCY_RULE,
    "curriculum_learning": LEGACY_CURRICULUM_RULE,
    "compression_training": COMPRESSION_RULE,
    **_GONE,
}


def deepspeed_top_level_keys() -> frozenset[str]:
    return frozenset(TOP_LEVEL)
