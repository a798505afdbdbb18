"""The valid range of every numeric key of a recipe, checked in one place before any work starts.

RANGES maps each int / float key (and each list of numbers, entry by entry) of RootConfig to the
loosest bound that holds whatever else the recipe says: `model.init_std` > 0, `data.val_fraction`
in (0, 0.5], seeds >= 0 ... A float must also be finite (OmegaConf takes `nan` and `inf`). What
depends on other keys (moe.k <= moe.num_experts, a curriculum's difficulty range, the batch triple)
stays with each group's validator; this table is what no recipe may go outside of, including a
group that is switched off. tests/unit/test_bad_input.py checks that every numeric field of the schema
(every option of optimizer / lr_scheduler included) has an entry, so a new field cannot skip it.

    check_ranges(root)   # ValueError: "model.norm_eps=0.0 must be > 0"
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

_SEED_MAX = 2**63 - 1


@dataclass(frozen=True)
class Range:
    """low / high bounds (open or closed), or a set of choices; nullable: None is valid too (`null_means` says what it does)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple | None = None
    nullable: bool = False
    null_means: str = ""

    def contains(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.choices is not None:
            return value in self.choices
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (self.high is not None and (value > self.high or (self.high_open and value == self.high)))

    def describe(self, with_null: bool = True) -> str:
        if self.choices is not None:
            text = f"one of: {', '.join(map(str, self.choices))}"
        elif self.low is not None and self.high is not None:
            text = f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {_num(self.low)}"
        elif self.high is not None:
            text = f"{'<' if self.high_open else '<='} {_num(self.high)}"
        else:
            text = "a finite number"
        if self.nullable and with_null:
            text += f" (or null{': ' + self.null_means if self.null_means else ''})"
        return text


def _num(x: float) -> str:
    return "2**63 - 1" if x == _SEED_MAX else (str(int(x)) if float(x).is_integer() else str(x))


def at_least(low: float, nullable: bool = False, null_means: str = "") -> Range:
    return Range(low=low, nullable=nullable, null_means=null_means)


def above(low: float, nullable: bool = False, null_means: str = "") -> Range:
    return Range(low=low, low_open=True, nullable=nullable, null_means=null_means)


def between(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Range:
    return Range(low=low, high=high, low_open=low_open, high_open=high_open)


POSITIVE_INT = at_least(1)
COUNT = at_least(0)  # a count or step index where 0 is meaningful
NON_NEGATIVE = at_least(0)
POSITIVE = above(0)
UNIT = between(0, 1)
SEED = Range(low=0, high=_SEED_MAX)
ANY = Range()  # only finiteness: the group's validator checks the value against the other keys


RANGES: dict[str, Range] = {
    # model
    "model.n_layer": POSITIVE_INT,
    "model.n_head": POSITIVE_INT,
    "model.n_kv_head": at_least(1, nullable=True, null_means="model.n_head"),
    "model.d_model": POSITIVE_INT,
    "model.d_ff": at_least(1, nullable=True, null_means="4*d_model, or SwiGLU's 8/3*d_model for llama"),
    "model.vocab_size": at_least(1, nullable=True, null_means="the tokenizer's"),
    "model.max_seq_len": POSITIVE_INT,
    "model.dropout": between(0, 1, high_open=True),
    "model.norm_eps": POSITIVE,
    "model.rope_theta": POSITIVE,
    "model.init_std": POSITIVE,
    # data
    "data.block_size": POSITIVE_INT,
    "data.val_fraction": between(0, 0.5, low_open=True),
    "data.max_bytes": at_least(1, nullable=True, null_means="no cap"),
    "data.num_proc": at_least(1, nullable=True, null_means="one process"),
    "data.split_seed": SEED,
    # optimizer (a key applies to every option that has it)
    "optimizer.lr": POSITIVE,
    "optimizer.weight_decay": NON_NEGATIVE,
    "optimizer.betas": between(0, 1, high_open=True),
    "optimizer.eps": NON_NEGATIVE,
    "optimizer.momentum": NON_NEGATIVE,
    "optimizer.lr_decay": NON_NEGATIVE,
    "optimizer.max_coeff": NON_NEGATIVE,
    "optimizer.min_coeff": NON_NEGATIVE,
    "optimizer.alpha": NON_NEGATIVE,
    # the 1-bit optimizers (onebitadam, zerooneadam, onebitlamb; DeepSpeed's keys)
    "optimizer.freeze_step": POSITIVE_INT,  # at least one uncompressed warm-up update
    "optimizer.var_freeze_step": COUNT,
    "optimizer.var_update_scaler": POSITIVE_INT,
    "optimizer.local_step_scaler": POSITIVE_INT,
    "optimizer.local_step_clipper": POSITIVE_INT,
    "optimizer.coeff_beta": between(0, 1, high_open=True),
    "optimizer.factor_max": POSITIVE,
    "optimizer.factor_min": POSITIVE,
    "optimizer.factor_threshold": between(0, 1, high_open=True),
    # lr_scheduler
    "lr_scheduler.warmup_num_steps": POSITIVE_INT,
    "lr_scheduler.total_num_steps": at_least(1, nullable=True, null_means="trainer.max_steps"),
    "lr_scheduler.warmup_min_ratio": UNIT,
    "lr_scheduler.cos_min_ratio": UNIT,
    "lr_scheduler.warmup_min_lr": NON_NEGATIVE,
    "lr_scheduler.warmup_max_lr": above(0, nullable=True, null_means="the optimizer's lr"),
    "lr_scheduler.cycle_min_lr": at_least(0, nullable=True, null_means="unset; one_cycle requires it"),
    "lr_scheduler.cycle_max_lr": at_least(0, nullable=True, null_means="unset; one_cycle requires it"),
    "lr_scheduler.decay_lr_rate": NON_NEGATIVE,
    "lr_scheduler.cycle_first_step_size": POSITIVE_INT,
    "lr_scheduler.cycle_second_step_size": at_least(0, nullable=True, null_means="cycle_first_step_size"),
    "lr_scheduler.cycle_first_stair_count": COUNT,
    "lr_scheduler.cycle_second_stair_count": at_least(0, nullable=True, null_means="cycle_first_stair_count"),
    "lr_scheduler.decay_step_size": COUNT,
    "lr_scheduler.cycle_min_mom": between(0, 1, high_open=True),
    "lr_scheduler.cycle_max_mom": between(0, 1, high_open=True),
    "lr_scheduler.decay_mom_rate": ANY,  # checked against the run length by the one_cycle validator
    "lr_scheduler.lr_range_test_min_lr": POSITIVE,
    "lr_scheduler.lr_range_test_step_size": POSITIVE_INT,
    "lr_scheduler.lr_range_test_step_rate": NON_NEGATIVE,
    "lr_scheduler.step_size": POSITIVE_INT,
    "lr_scheduler.gamma": POSITIVE,
    # precision
    "precision.loss_scale": NON_NEGATIVE,
    "precision.initial_scale_power": between(0, 127),  # 2**power must be a finite fp32 number
    "precision.loss_scale_window": POSITIVE_INT,
    "precision.hysteresis": POSITIVE_INT,
    "precision.min_loss_scale": POSITIVE,
    # trainer
    "trainer.max_steps": POSITIVE_INT,
    "trainer.train_batch_size": at_least(1, nullable=True, null_means="from the other batch keys"),
    "trainer.train_micro_batch_size_per_gpu": at_least(1, nullable=True, null_means="from the other batch keys"),
    "trainer.gradient_accumulation_steps": at_least(1, nullable=True, null_means="from the other batch keys"),
    "trainer.gradient_clipping": NON_NEGATIVE,
    "trainer.log_interval": POSITIVE_INT,
    "trainer.eval_interval": COUNT,
    "trainer.eval_batches": COUNT,
    "trainer.seed": SEED,
    "trainer.peak_tflops": above(0, nullable=True, null_means="known GPUs detected, else MFU not logged"),
    "trainer.sample_tokens": COUNT,
    "trainer.sample_temperature": NON_NEGATIVE,
    "trainer.sample_top_k": COUNT,
    # checkpoint
    "checkpoint.interval": COUNT,
    "checkpoint.keep_last": COUNT,
    # zero, parallel, launcher
    "zero.stage": Range(choices=(0, 1, 2, 3)),
    "zero.hybrid_shard_size": COUNT,
    "zero.zero_hpz_partition_size": COUNT,
    "zero.zero_quantized_gradients_bits": Range(choices=(8, 4)),
    "zero.buffer_count": at_least(1),
    "zero.param_buffer_count": at_least(1),
    "zero.buffer_size": at_least(1),
    "zero.aio.block_size": at_least(4096),
    "zero.aio.queue_depth": between(1, 1024),
    "zero.aio.thread_count": at_least(1),
    "parallel.tp": POSITIVE_INT,
    "parallel.pp": POSITIVE_INT,
    "parallel.sp": POSITIVE_INT,
    "launcher.max_restarts": COUNT,
    "launcher.collective_timeout_s": POSITIVE_INT,
    "launcher.nnodes": POSITIVE_INT,
    "launcher.node_rank": COUNT,
    "launcher.rdzv_timeout_s": POSITIVE_INT,
    # activation_checkpointing
    "activation_checkpointing.every_k": POSITIVE_INT,
    # moe
    "moe.num_experts": COUNT,
    "moe.k": POSITIVE_INT,
    "moe.capacity_factor": POSITIVE,
    "moe.eval_capacity_factor": POSITIVE,
    "moe.min_capacity": COUNT,
    "moe.expert_interval": POSITIVE_INT,
    "moe.layers": COUNT,
    "moe.d_ff": at_least(1, nullable=True, null_means="the model's MLP size"),
    "moe.aux_loss_coef": NON_NEGATIVE,
    "moe.z_loss_coef": NON_NEGATIVE,
    "moe.ep_size": POSITIVE_INT,
    # data_efficiency (difficulties depend on the metric: its validator checks them)
    "data_efficiency.seed": SEED,
    "data_efficiency.curriculum_learning.min_difficulty": Range(nullable=True),
    "data_efficiency.curriculum_learning.max_difficulty": Range(nullable=True, null_means="data.block_size for seqlen"),
    "data_efficiency.curriculum_learning.total_curriculum_step": at_least(1, nullable=True),
    "data_efficiency.curriculum_learning.difficulty_step": at_least(1, nullable=True),
    "data_efficiency.curriculum_learning.root_degree": above(0, nullable=True),
    "data_efficiency.curriculum_learning.difficulty": Range(nullable=True),
    "data_efficiency.curriculum_learning.max_step": at_least(0, nullable=True),
    "data_efficiency.random_ltd.random_ltd_layer_id": at_least(0, nullable=True, null_means="every layer but the first and last"),
    "data_efficiency.random_ltd.min_value": POSITIVE_INT,
    "data_efficiency.random_ltd.max_value": at_least(1, nullable=True, null_means="data.block_size"),
    "data_efficiency.random_ltd.require_steps": POSITIVE_INT,
    "data_efficiency.random_ltd.seq_per_step": POSITIVE_INT,
    # compression
    "compression.weight_quantization.start_bits": between(2, 16),
    "compression.weight_quantization.target_bits": between(2, 16),
    "compression.weight_quantization.quantization_period": COUNT,  # 0: target_bits at once
    "compression.weight_quantization.schedule_offset": COUNT,
    "compression.weight_quantization.quantize_groups": POSITIVE_INT,
    "compression.weight_quantization.seed": Range(low=0, high=_SEED_MAX, nullable=True, null_means="unseeded"),
    "compression.activation_quantization.bits": between(4, 16),
    "compression.activation_quantization.schedule_offset": COUNT,
    "compression.activation_quantization.momentum": between(0, 1, low_open=True),
    "compression.sparse_pruning.dense_ratio": between(0, 1, low_open=True),
    "compression.sparse_pruning.schedule_offset": COUNT,
    "compression.sparse_pruning.schedule_offset_end": at_least(0, nullable=True, null_means="schedule_offset"),
    "compression.sparse_pruning.schedule_offset_stride": POSITIVE_INT,
    "compression.row_pruning.dense_ratio": between(0, 1, low_open=True),
    "compression.row_pruning.schedule_offset": COUNT,
    "compression.head_pruning.dense_ratio": between(0, 1, low_open=True),
    "compression.head_pruning.schedule_offset": COUNT,
    "compression.head_pruning.num_heads": at_least(1, nullable=True, null_means="model.n_head"),
    "compression.channel_pruning.dense_ratio": between(0, 1, low_open=True),
    "compression.channel_pruning.schedule_offset": COUNT,
    "compression.layer_reduction.keep_number_layer": at_least(1, nullable=True),
    "compression.layer_reduction.teacher_layer": COUNT,
    "compression.layer_reduction.temperature": POSITIVE,
    "compression.layer_reduction.kd_weight": NON_NEGATIVE,
    "compression.layer_reduction.hidden_weight": NON_NEGATIVE,
    # sparse_attention
    "sparse_attention.block": POSITIVE_INT,
    "sparse_attention.num_local_blocks": POSITIVE_INT,
    "sparse_attention.num_global_blocks": COUNT,
    "sparse_attention.num_different_global_patterns": POSITIVE_INT,
    "sparse_attention.num_random_blocks": COUNT,
    "sparse_attention.local_window_blocks": POSITIVE_INT,
    "sparse_attention.global_block_indices": COUNT,
    "sparse_attention.global_block_end_indices": at_least(1, nullable=True, null_means="one block per start"),
    "sparse_attention.num_sliding_window_blocks": POSITIVE_INT,
    "sparse_attention.seed": SEED,
    # flops_profiler, profiler (against trainer.max_steps: dsrecipes.profiling.config)
    "flops_profiler.profile_step": COUNT,
    "flops_profiler.module_depth": at_least(-1),
    "flops_profiler.top_modules": POSITIVE_INT,
    "flops_profiler.recompute_fwd_factor": NON_NEGATIVE,
    "profiler.wait": COUNT,
    "profiler.warmup": COUNT,
    "profiler.active": POSITIVE_INT,
    "profiler.repeat": COUNT,
    "profiler.memory_snapshot_max_entries": POSITIVE_INT,
    # generate (mode=generate / serve-bench)
    "generate.batch_size": POSITIVE_INT,
    "generate.max_new_tokens": COUNT,
    "generate.temperature": NON_NEGATIVE,
    "generate.top_k": COUNT,
    "generate.top_p": between(0, 1, low_open=True),
    "generate.repetition_penalty": POSITIVE,
    "generate.stop_tokens": at_least(0, nullable=True, null_means="the tokenizer's end-of-sequence id"),
    "generate.seed": SEED,
    "generate.quant_group_size": COUNT,
    "generate.tp_size": POSITIVE_INT,
    "generate.bench_batch_sizes": POSITIVE_INT,
    "generate.bench_prompt_len": POSITIVE_INT,
    "generate.bench_new_tokens": POSITIVE_INT,
    "generate.bench_repeats": POSITIVE_INT,
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, (bool, Enum))


def check_value(key: str, value: Any, rule: Range) -> None:
    """ValueError naming key, value and the valid range unless value (a number, a list of numbers or None) fits rule."""
    if value is None:
        if not rule.nullable:
            raise ValueError(f"{key}=null is not valid; it must be {rule.describe()}")
        return
    if isinstance(value, (list, tuple)):
        for index, entry in enumerate(value):
            if _is_number(entry) and not rule.contains(entry):
                raise ValueError(f"{key}={list(value)} is not valid: entry {index} is {entry}; every entry must be "
                                 f"{rule.describe(with_null=False)}")
        return
    if _is_number(value) and not rule.contains(value):
        if rule.choices is not None:
            raise ValueError(f"{key}={value} is not valid; choose {rule.describe()}")
        raise ValueError(f"{key}={value} must be {rule.describe()}")


def _walk(obj: Any, prefix: str):
    """(key, value) of every field of a config dataclass object, nested sections flattened."""
    for f in dataclasses.fields(obj):
        if f.metadata.get("omegaconf_ignore"):
            continue
        value = getattr(obj, f.name)
        key = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _walk(value, key)
        else:
            yield key, value


def check_ranges(root: Any) -> None:
    """ValueError for the first numeric key of root (a RootConfig) outside its RANGES entry."""
    for key, value in _walk(root, ""):
        rule = RANGES.get(key)
        if rule is not None:
            check_value(key, value, rule)


def check_section(section: Any, group: str, prefix: str | None = None) -> None:
    """The RANGES of `group`'s keys on one section object (a ModelConfig, a GenerateConfig ...), named `prefix`.*"""
    for key, value in _walk(section, group):
        rule = RANGES.get(key)
        if rule is not None:
            check_value(key if prefix is None else prefix + key[len(group):], value, rule)


def _numeric(tp: Any) -> bool:
    """int / float (optionally None or a list of them): the field types RANGES must cover."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (list, tuple):
        return bool(args) and all(_numeric(a) for a in args)
    if args and typing.get_origin(tp) is not None:  # X | None, or int | str (a number or a name such as "node")
        numbers = [a for a in args if a is not str]
        return bool(numbers) and all(_numeric(a) for a in numbers)
    return tp in (int, float)


def numeric_keys(schema: type, option_schemas: dict | None = None, prefix: str = "") -> set[str]:
    """Every numeric key of a config schema; a group in option_schemas ({group: {option: schema}}, e.g.
    dsrecipes.training.config.OPTION_SCHEMAS) counts the union over its options' schemas."""
    option_schemas = option_schemas or {}
    keys: set[str] = set()
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if f.metadata.get("omegaconf_ignore"):
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        if not prefix and f.name in option_schemas:
            for option in option_schemas[f.name].values():
                keys |= numeric_keys(option, prefix=key)
        elif dataclasses.is_dataclass(tp):
            keys |= numeric_keys(tp, prefix=key)
        elif _numeric(tp):
            keys.add(key)
    return keys
