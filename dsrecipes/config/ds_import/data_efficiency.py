"""DeepSpeed's `data_efficiency` block (and the legacy top-level `curriculum_learning`) -> the data_efficiency group.

DeepSpeed nests the switches: curriculum learning runs when data_efficiency.enabled,
data_sampling.enabled and data_sampling.curriculum_learning.enabled are all true; random-LTD when
data_efficiency.enabled, data_routing.enabled and data_routing.random_ltd.enabled are. dsrecipes'
group is flat (data_efficiency.curriculum_learning / random_ltd, each with one `enabled`), so each
gets the conjunction; the keys of a part that ends up off have no effect.

Curriculum: one metric (dsrecipes scores the samples itself): a DeepSpeed metric named seqlen
-> metric=seqlen, vocabularyrarity / vocab_rarity -> vocab_rarity; its difficulty / schedule keys
map by name (schedule_config flattened). The index files of DeepSpeed's offline data analysis have
no effect (dsrecipes' analyzer computes the index). Refused: several metrics, other metric names,
single_cluster, dynamic batching. random-LTD: layer ids, schedule (fixed_linear only) and
layer_token_lr_schedule.enabled map; DeepSpeed's own layer-token lr warmup / total are refused
(dsrecipes drives the configured lr schedule by layer-token-equivalent steps instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsrecipes.config.ds_import.rules import (
    Custom,
    Handled,
    NoEffect,
    RefuseUnless,
    Rule,
    Sub,
    To,
    apply_table,
    one_of,
    refused_when_on,
)
from dsrecipes.config.ds_import.translation import MAPPED, Translation

CL = "data_efficiency.curriculum_learning"
LTD = "data_efficiency.random_ltd"
METRICS = {"seqlen": "seqlen", "vocabularyrarity": "vocab_rarity", "vocab_rarity": "vocab_rarity"}
_SCHEDULE_CONFIG = ("total_curriculum_step", "difficulty_step", "root_degree", "difficulty", "max_step")


_LR_REFUSED = RefuseUnless("DeepSpeed's own layer-token lr schedule; dsrecipes drives lr_scheduler's schedule by "
                           "layer-token-equivalent steps instead (set its warmup / total in steps)", ok=())
LAYER_TOKEN_LR_TABLE: dict[str, Rule] = {"enabled": To(f"{LTD}.layer_token_lr_schedule"), "total_layer_tokens": _LR_REFUSED,
                                         "warmup_type": _LR_REFUSED, "warmup_layer_tokens": _LR_REFUSED}


def _schedule_config(prefix: str) -> Rule:
    return Sub({key: To(f"{prefix}.{key}") for key in _SCHEDULE_CONFIG}, "curriculum schedule_config")


def metric_table(on: bool) -> dict[str, Rule]:
    table: dict[str, Rule] = {
        "index_to_sample_path": NoEffect("dsrecipes' data analyzer computes the sample index itself"),
        "index_to_metric_path": NoEffect("dsrecipes' data analyzer computes the metric index itself"),
        "clustering_type": RefuseUnless("single_cluster puts every sample in one cluster (no curriculum); dsrecipes "
                                        "draws within the scheduled difficulty", ok=("schedule_based",),
                                        ok_why="what dsrecipes' CurriculumSampler does"),
        "difficulty_type": To(f"{CL}.difficulty_type"), "min_difficulty": To(f"{CL}.min_difficulty"),
        "max_difficulty": To(f"{CL}.max_difficulty"), "schedule_type": To(f"{CL}.schedule_type"),
        "schedule_config": _schedule_config(CL),
    }
    return table if on else {key: NoEffect("curriculum learning is not enabled") for key in table}


def _read_metrics(t: Translation, key: str, metrics: Any, on: bool) -> None:
    if not isinstance(metrics, Mapping) or (on and len(metrics) != 1):
        t.refused(key, metrics, "dsrecipes runs one curriculum metric; give exactly one")
        return
    for name, block in metrics.items():
        if on and name not in METRICS:
            t.refused(f"{key}.{name}", block, f"dsrecipes scores samples itself with {', '.join(sorted(METRICS))} "
                                              "(or an import path in data_efficiency.curriculum_learning.metric)")
            continue
        if on:
            t.set(f"{CL}.metric", METRICS[name])
        apply_table(t, f"{key}.{name}", block if isinstance(block, Mapping) else {}, metric_table(on),
                    "curriculum metric")


def read_data_efficiency(t: Translation, key: str, block: Any) -> None:
    if not isinstance(block, Mapping):
        t.refused(key, block, "DeepSpeed's data_efficiency is a block")
        return
    outer = block.get("enabled", False) is True
    sampling = block.get("data_sampling") or {}
    routing = block.get("data_routing") or {}
    curriculum = sampling.get("curriculum_learning") or {}
    ltd = routing.get("random_ltd") or {}
    cl_on = outer and sampling.get("enabled", False) is True and curriculum.get("enabled", False) is True
    ltd_on = outer and routing.get("enabled", False) is True and ltd.get("enabled", False) is True
    for path, value in ((f"{key}.enabled", block.get("enabled")),
                        (f"{key}.data_sampling.enabled", sampling.get("enabled")),
                        (f"{key}.data_routing.enabled", routing.get("enabled"))):
        if value is not None:
            t.record(path, value, MAPPED, "a switch of data_efficiency.curriculum_learning / random_ltd.enabled "
                                          f"(curriculum: {str(cl_on).lower()}, random-LTD: {str(ltd_on).lower()})")
    if curriculum:
        t.mapped(f"{key}.data_sampling.curriculum_learning.enabled", curriculum.get("enabled", False),
                 f"{CL}.enabled", cl_on)
        if cl_on:
            t.set(f"{CL}.seqlen_mode", "truncate")
    if ltd:
        t.mapped(f"{key}.data_routing.random_ltd.enabled", ltd.get("enabled", False), f"{LTD}.enabled", ltd_on)
    top: dict[str, Rule] = {
        "enabled": Handled(), "seed": To("data_efficiency.seed"),
        "data_sampling": Sub(sampling_table(cl_on), "data_sampling"),
        "data_routing": Sub(routing_table(ltd_on), "data_routing"),
    }
    apply_table(t, key, block, top, "data_efficiency")


def sampling_table(on: bool) -> dict[str, Rule]:
    curriculum = {
        "enabled": Handled(),
        "data_cluster_path": NoEffect("dsrecipes keeps its difficulty clusters in memory"),
        "curriculum_metrics": Custom(lambda t, key, value: _read_metrics(t, key, value, on), kind="custom"),
    }
    return {
        "enabled": Handled(),
        "num_epochs": NoEffect("DeepSpeed's sampler's epoch budget; dsrecipes draws for as long as training runs"),
        "num_workers": NoEffect("a data loading speed option"), "pin_memory": NoEffect("a data loading speed option"),
        "curriculum_learning": Sub(curriculum, "curriculum_learning"),
        "dynamic_batching": refused_when_on("dynamic batching (variable batch sizes with lr scaling) is not supported "
                                            "yet", "dynamic batching is not enabled"),
    }


def routing_table(on: bool) -> dict[str, Rule]:
    off = NoEffect("random-LTD is not enabled")
    schedule_config = {"require_steps": To(f"{LTD}.require_steps"), "seq_per_step": To(f"{LTD}.seq_per_step")}
    schedule = {
        "min_value": To(f"{LTD}.min_value"), "max_value": To(f"{LTD}.max_value"),
        "schedule_type": RefuseUnless("dsrecipes (as DeepSpeed) implements the fixed_linear random-LTD schedule only",
                                      ok=("fixed_linear",), ok_why="the schedule dsrecipes implements"),
        "schedule_config": Sub(schedule_config, "random_ltd_schedule.schedule_config"),
    }
    lr_schedule = LAYER_TOKEN_LR_TABLE
    random_ltd: dict[str, Rule] = {
        "enabled": Handled(),
        "total_layer_num": NoEffect("dsrecipes reads the model's depth"),
        "random_ltd_layer_num": NoEffect("implied by random_ltd_layer_id"),
        "random_ltd_layer_id": To(f"{LTD}.random_ltd_layer_id"),
        "model_mask_name": NoEffect("dsrecipes' GPT builds its causal mask itself"),
        "model_type": RefuseUnless("dsrecipes' models are decoders", ok=("decoder",), ok_why="dsrecipes' GPT"),
        "hidden_state_order": NoEffect("dsrecipes knows its own hidden-state layout"),
        "micro_batch_size": NoEffect("filled by DeepSpeed's engine"),
        "global_batch_size": NoEffect("filled by DeepSpeed's engine"),
        "random_ltd_schedule": Sub(schedule, "random_ltd_schedule"),
        "layer_token_lr_schedule": Custom(lambda t, key, value: _read_lr_schedule(t, key, value, lr_schedule),
                                          kind="custom"),
    }
    if not on:
        random_ltd = {key: rule if isinstance(rule, Handled) else off for key, rule in random_ltd.items()}
    return {"enabled": Handled(),
            "random_ltd": Sub(random_ltd, "random_ltd")}


def _read_lr_schedule(t: Translation, key: str, block: Any, table: dict[str, Rule]) -> None:
    block = block or {}
    if not block.get("enabled"):
        table = {name: NoEffect("layer_token_lr_schedule is not enabled") for name in table}
    apply_table(t, key, block, table, "layer_token_lr_schedule")


_LEGACY_TYPES = {"seqlen": "seqlen"}


def read_legacy_curriculum(t: Translation, key: str, block: Any) -> None:
    """The top-level curriculum_learning of older DeepSpeed (removed in 0.19.7): a seqlen curriculum."""
    if not isinstance(block, Mapping):
        t.refused(key, block, "DeepSpeed's curriculum_learning is a block")
        return
    on = block.get("enabled", False) is True
    if on and t.get(f"{CL}.enabled"):
        t.refused(f"{key}.enabled", True, "data_efficiency's curriculum is enabled too; dsrecipes runs one curriculum")
        return
    table: dict[str, Rule] = {
        "enabled": To(f"{CL}.enabled"),
        "curriculum_type": To(f"{CL}.metric", one_of("curriculum_type", _LEGACY_TYPES)),
        "min_difficulty": To(f"{CL}.min_difficulty"), "max_difficulty": To(f"{CL}.max_difficulty"),
        "schedule_type": To(f"{CL}.schedule_type"), "schedule_config": _schedule_config(CL),
    }
    if not on:
        table = {name: NoEffect("curriculum_learning is not enabled") for name in table}
    elif "curriculum_type" not in block:
        t.set(f"{CL}.metric", "seqlen")
    if on:
        t.set(f"{CL}.seqlen_mode", "truncate")
    apply_table(t, key, block, table, "curriculum_learning")


DATA_EFFICIENCY_RULE = Custom(read_data_efficiency)
LEGACY_CURRICULUM_RULE = Custom(read_legacy_curriculum)
