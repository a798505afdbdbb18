"""Every DeepSpeed key the tables know, with what dsrecipes does with it: the key catalog.

    python -c "from dsrecipes.config.ds_import.catalog import print_catalog; print_catalog()"

`catalog()` walks the tables (top level, nested blocks, each optimizer type's and schedule's params)
and returns one row per key: mapped (onto a dsrecipes key), no effect (accepted: speed, memory or
log options), refused (unless set to a harmless value: the reason is in the table), custom (read
by a function that decides per value). Type-dependent params carry the type (`optimizer.params.lr
[Lamb]`). Used by the tests, to hold the round-trip configs to covering every mapped key, and to
check the tables against DeepSpeed's own config models where DeepSpeed is installed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields

from dsrecipes.config.ds_import import data_efficiency as de
from dsrecipes.config.ds_import.model_blocks import _NO_FIELD
from dsrecipes.config.ds_import.optimizer import (
    ADAGRAD_TABLE,
    LAMB_TABLE,
    LION_TABLE,
    RMSPROP_TABLE,
    SCHEDULES,
    SGD_TABLE,
    STEP_LR_TABLE,
    _adam_table,
)
from dsrecipes.config.ds_import.precision import AUTOCAST_TABLE, BATCH_KEYS, BF16_TABLE, FP16_TABLE
from dsrecipes.config.ds_import.rules import Custom, Handled, NoEffect, RefuseUnless, Rule, Sub, To
from dsrecipes.config.ds_import.top_level import TOP_LEVEL
from dsrecipes.config.ds_import.zero import ZERO_TABLE

MAPPED, NO_EFFECT, REFUSED, CUSTOM = "mapped", "no effect", "refused", "custom"


def _kind(rule: Rule) -> str:
    if isinstance(rule, To):
        return MAPPED
    if isinstance(rule, NoEffect):
        return NO_EFFECT
    if isinstance(rule, RefuseUnless):
        return REFUSED
    return rule.kind if isinstance(rule, Custom) else CUSTOM


def _walk(prefix: str, table: Mapping[str, Rule], suffix: str = "") -> Iterator[tuple[str, str]]:
    for key, rule in table.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(rule, Sub):
            yield from _walk(path, rule.table, suffix)
        elif not isinstance(rule, Handled):
            yield path + suffix, _kind(rule)


_COMPRESSION_KEYS = {  # DeepSpeed 0.19.6's compression_training keys (shared_parameters, then group params)
    "weight_quantization": ("enabled", "quantizer_kernel", "schedule_offset", "quantize_groups", "quantize_verbose",
                            "quantization_type", "rounding", "quantize_weight_in_forward", "fp16_mixed_quantize",
                            "start_bits", "target_bits", "quantization_period"),
    "activation_quantization": ("enabled", "quantization_type", "range_calibration", "schedule_offset", "bits"),
    "sparse_pruning": ("enabled", "method", "schedule_offset", "schedule_offset_end", "schedule_offset_stride",
                       "block_pattern", "dense_ratio", "excluded_modules"),
    "row_pruning": ("enabled", "method", "schedule_offset", "dense_ratio", "related_modules"),
    "head_pruning": ("enabled", "method", "schedule_offset", "num_heads", "dense_ratio", "related_modules"),
    "channel_pruning": ("enabled", "method", "schedule_offset", "dense_ratio", "related_modules"),
    "layer_reduction": ("enabled", "keep_number_layer", "module_name_prefix", "teacher_layer", "other_module_name"),
}


def _compression_rows() -> Iterator[tuple[str, str]]:
    from dsrecipes.compression.config import CompressionConfig

    defaults = CompressionConfig()
    for technique, keys in _COMPRESSION_KEYS.items():
        section = {f.name for f in fields(getattr(defaults, technique))}
        for key in (*keys, "modules") if technique != "layer_reduction" else keys:
            kind = MAPPED if key in section else NO_EFFECT if key in _NO_FIELD else REFUSED
            yield f"compression_training.{technique}.{key}", kind


def catalog() -> list[tuple[str, str]]:
    """(DeepSpeed key, mapped | no effect | refused | custom) for every key the tables know."""
    rows: list[tuple[str, str]] = [(key, MAPPED) for key in BATCH_KEYS]
    for name, table in (("fp16", FP16_TABLE), ("bf16", BF16_TABLE), ("torch_autocast", AUTOCAST_TABLE)):
        rows += [(f"{name}.enabled", MAPPED)] + list(_walk(name, table))
    rows += [("torch_autocast.dtype", MAPPED), ("amp.enabled", REFUSED)]
    rows += [(key, kind) for key, kind in _walk("", TOP_LEVEL) if key not in ("optimizer", "scheduler")]
    rows += list(_walk("zero_optimization", ZERO_TABLE))
    rows += [("optimizer.type", MAPPED), ("optimizer.legacy_fusion", NO_EFFECT)]
    optimizer_tables = {"Adam": _adam_table("adam", False, True), "AdamW": _adam_table("adamw", False, True),
                        "Lamb": LAMB_TABLE, "Lion": LION_TABLE, "Adagrad": ADAGRAD_TABLE, "SGD": SGD_TABLE,
                        "RMSprop": RMSPROP_TABLE}
    for name, table in optimizer_tables.items():
        rows += list(_walk("optimizer.params", table, f" [{name}]"))
    rows += [("scheduler.type", MAPPED)]
    for name, (_, table) in {**SCHEDULES, "StepLR": ("torch_step", STEP_LR_TABLE)}.items():
        rows += list(_walk("scheduler.params", table, f" [{name}]"))
    sampling = "data_efficiency.data_sampling"
    rows += [("data_efficiency.enabled", MAPPED), (f"{sampling}.enabled", MAPPED),
             ("data_efficiency.data_routing.enabled", MAPPED),
             (f"{sampling}.curriculum_learning.enabled", MAPPED),
             ("data_efficiency.data_routing.random_ltd.enabled", MAPPED)]
    rows += list(_walk(sampling, de.sampling_table(True)))
    rows += list(_walk(f"{sampling}.curriculum_learning.curriculum_metrics.<metric>", de.metric_table(True)))
    rows += list(_walk("data_efficiency.data_routing", de.routing_table(True)))
    rows += list(_walk("data_efficiency.data_routing.random_ltd.layer_token_lr_schedule", de.LAYER_TOKEN_LR_TABLE))
    rows += [("data_efficiency.seed", MAPPED)]
    rows += [(f"curriculum_learning.{key}", MAPPED) for key in ("enabled", "curriculum_type", "min_difficulty",
                                                                "max_difficulty", "schedule_type")]
    rows += [(f"curriculum_learning.schedule_config.{key}", MAPPED) for key in de._SCHEDULE_CONFIG]
    rows += list(_compression_rows())
    drop = {"data_efficiency", "curriculum_learning", "compression_training", "zero_optimization"}  # listed key by key
    return [(key, kind) for key, kind in rows if key not in drop and kind != CUSTOM]


def counts() -> dict[str, int]:
    rows = catalog()
    return {kind: sum(k == kind for _, k in rows) for kind in (MAPPED, NO_EFFECT, REFUSED)}


def print_catalog() -> None:
    rows = catalog()
    for key, kind in rows:
        print(f"{kind:10s} {key}")
    print(", ".join(f"{n} {kind}" for kind, n in counts().items()), f"({len(rows)} keys)")
