"""Keys that a recipe sets but that have no effect, because the group or mode that reads them is off.

`moe.k=2` with `moe=none`, `precision.loss_scale=128` with dtype fp32, `logger.wandb_project=x` with
wandb off: the run is valid, but the key does nothing, which is almost always a mistake (a missing
group option on the command line). Each such key is reported as one UserWarning naming the key,
its value and what would make it count; it is not an error, since the run does what the rest of the
recipe says and a shared base config may well carry keys that only some of its runs use.

A key counts as set when its value differs from the schema's default (the values alone decide,
so the check works the same for the CLI and for `dsrecipes.initialize(config=...)`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable
from typing import Any

_FP16_KEYS = ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
              "min_loss_scale", "raise_error_at_min_scale")
_DYNAMIC_SCALE_KEYS = _FP16_KEYS[1:]
_COMPRESSION_SECTIONS = ("weight_quantization", "activation_quantization", "sparse_pruning", "row_pruning",
                         "head_pruning", "channel_pruning", "layer_reduction")


@dataclasses.dataclass(frozen=True)
class Rule:
    """When `off(root)`, the keys of section `path` (all of its fields but `but`, or only `keys`) have no effect."""

    path: str
    off: Callable[[Any], bool]
    reason: Callable[[Any], str]
    keys: tuple[str, ...] | None = None
    but: tuple[str, ...] = ()


def _get(root: Any, path: str) -> Any:
    node = root
    for part in path.split("."):
        node = getattr(node, part)
    return node


def _rules() -> list[Rule]:
    rules = [
        Rule("moe", lambda r: not r.moe.enabled, lambda r: "moe is off (moe.num_experts=0); choose an moe option "
             "(e.g. moe=top2) or set moe.num_experts", but=("num_experts",)),
        Rule("precision", lambda r: r.precision.dtype != "fp16", lambda r: f"loss scaling is fp16's and "
             f"precision.dtype={r.precision.dtype}", keys=_FP16_KEYS),
        Rule("precision", lambda r: r.precision.dtype == "fp16" and r.precision.loss_scale > 0, lambda r: f"these "
             f"tune dynamic loss scaling and precision.loss_scale={r.precision.loss_scale} is a static scale "
             "(0 = dynamic)", keys=_DYNAMIC_SCALE_KEYS),
        Rule("precision", lambda r: r.precision.dtype == "fp16", lambda r: "fp16 skips overflowing steps through its "
             "loss scaler (nonfinite_grads is for fp32/bf16)", keys=("nonfinite_grads",)),
        Rule("trainer", lambda r: r.trainer.sample_tokens == 0, lambda r: "trainer.sample_tokens=0 (no text sample "
             "at the end)", keys=("sample_prompt", "sample_temperature", "sample_top_k")),
        Rule("trainer", lambda r: r.trainer.sample_tokens > 0 and r.trainer.sample_temperature == 0, lambda r:
             "trainer.sample_temperature=0 samples greedily", keys=("sample_top_k",)),
        Rule("logger", lambda r: not r.logger.wandb, lambda r: "logger.wandb=false (choose logger=wandb or logger=all)",
             keys=("wandb_project", "wandb_entity", "wandb_mode", "wandb_tags", "wandb_group")),
        Rule("parallel", lambda r: r.parallel.pp == 1, lambda r: "parallel.pp=1 (no pipeline)",
             keys=("pp_schedule", "pp_partition")),
        Rule("parallel", lambda r: r.parallel.tp == 1, lambda r: "parallel.tp=1 (no tensor parallelism)",
             keys=("tp_sequence_parallel",)),
        Rule("zero", lambda r: r.zero.stage < 2, lambda r: f"zero.stage={r.zero.stage} replicates (hybrid sharding "
             "is for stages 2 and 3)", keys=("hybrid_shard_size",)),
        Rule("zero", lambda r: not r.zero.zero_quantized_gradients, lambda r: "zero.zero_quantized_gradients=false "
             "(the bit width is qgZ's)", keys=("zero_quantized_gradients_bits",)),
        Rule("activation_checkpointing", lambda r: r.activation_checkpointing.mode == "none", lambda r:
             "activation_checkpointing.mode=none", but=("mode",)),
        Rule("activation_checkpointing", lambda r: r.activation_checkpointing.mode == "full", lambda r:
             "activation_checkpointing.mode=full checkpoints every block", keys=("every_k",)),
        Rule("data", lambda r: r.data.source != "files", lambda r: f"data.source={r.data.source} (paths are for "
             "data=files)", keys=("paths",)),
        Rule("data", lambda r: r.data.source != "hub", lambda r: f"data.source={r.data.source} (hub_* keys are for "
             "data=hub)", keys=("hub_name", "hub_config", "hub_split")),
        Rule("data", lambda r: r.data.source == "builtin", lambda r: "data.source=builtin reads text files (the "
             "column name is for json / parquet / hub data)", keys=("text_field",)),
        Rule("model", lambda r: r.model.style != "llama", lambda r: f"model.style={r.model.style} has learned "
             "positions (rotary embeddings are llama's)", keys=("rope_theta",)),
        Rule("generate", lambda r: r.mode == "train", lambda r: "mode=train (the generate group is read by "
             "mode=generate and mode=serve-bench)"),
        Rule("generate", lambda r: r.mode == "generate", lambda r: "mode=generate (bench_* keys are for "
             "mode=serve-bench)", keys=("bench_batch_sizes", "bench_prompt_len", "bench_new_tokens", "bench_repeats",
                                        "bench_impls")),
        Rule("sparse_attention", lambda r: r.sparse_attention.mode == "none", lambda r: "sparse_attention.mode=none "
             "(dense attention)", but=("mode",)),
        Rule("data_efficiency.curriculum_learning", lambda r: not r.data_efficiency.curriculum_learning.enabled,
             lambda r: "data_efficiency.curriculum_learning.enabled=false", but=("enabled",)),
        Rule("data_efficiency.random_ltd", lambda r: not r.data_efficiency.random_ltd.enabled,
             lambda r: "data_efficiency.random_ltd.enabled=false", but=("enabled",)),
        Rule("data_efficiency", lambda r: not (r.data_efficiency.curriculum_learning.enabled
                                               or r.data_efficiency.random_ltd.enabled),
             lambda r: "no data_efficiency technique is enabled", keys=("seed",)),
        Rule("flops_profiler", lambda r: not r.flops_profiler.enabled, lambda r: "flops_profiler.enabled=false "
             "(choose flops_profiler=enabled)", but=("enabled",)),
        Rule("compile", lambda r: r.compile.scope == "none", lambda r: "compile.scope=none (choose compile=blocks "
             "or compile=full)", but=("scope",)),
        Rule("compile", lambda r: r.compile.scope == "full", lambda r: "compile=full compiles the loss with the "
             "whole model", keys=("loss",)),
        Rule("comms_logger", lambda r: not r.comms_logger.enabled, lambda r: "comms_logger.enabled=false "
             "(choose comms_logger=enabled)", but=("enabled",)),
        Rule("comms_logger", lambda r: r.comms_logger.prof_all, lambda r: "comms_logger.prof_all=true logs every op",
             keys=("prof_ops",)),
        Rule("profiler", lambda r: not r.profiler.enabled, lambda r: "profiler.enabled=false (choose profiler=trace)",
             but=("enabled",)),
        Rule("profiler", lambda r: not r.profiler.memory_snapshot, lambda r: "profiler.memory_snapshot=false",
             keys=("memory_snapshot_max_entries",)),
        Rule("compression", lambda r: not r.compression.enabled, lambda r: "no compression technique is enabled",
             keys=("export_dirname",)),  # not `export`: compression=none itself sets it false
    ]
    for section in _COMPRESSION_SECTIONS:
        rules.append(Rule(f"compression.{section}", lambda r, s=section: not getattr(r.compression, s).enabled,
                          lambda r, s=section: f"compression.{s}.enabled=false", but=("enabled",)))
    rules.append(Rule("lr_scheduler", lambda r: getattr(r.lr_scheduler, "cycle_momentum", True) is False,
                      lambda r: "lr_scheduler.cycle_momentum=false (one_cycle)",
                      keys=("cycle_min_mom", "cycle_max_mom", "decay_mom_rate")))
    return rules


def _section_keys(section: Any, rule: Rule) -> Iterable[str]:
    names = [f.name for f in dataclasses.fields(section) if not f.metadata.get("omegaconf_ignore")]
    return [n for n in names if n not in rule.but] if rule.keys is None else [n for n in rule.keys if n in names]


def _changed(value: Any, default: Any) -> bool:
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return list(value) != list(default)
    return value != default


def inactive_keys(root: Any) -> list[tuple[str, Any, str]]:
    """(key, value, why it has no effect) for every key of root (a RootConfig) set away from its default
    in a group or mode that is off."""
    found: list[tuple[str, Any, str]] = []
    seen: set[str] = set()
    for rule in _rules():
        if not rule.off(root):
            continue
        section = _get(root, rule.path)
        default = type(section)()
        for name in _section_keys(section, rule):
            key = f"{rule.path}.{name}"
            value = getattr(section, name)
            if key not in seen and _changed(value, getattr(default, name)):
                seen.add(key)
                found.append((key, value, rule.reason(root)))
    return found


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return "null" if value is None else str(value)


def warn_inactive_keys(root: Any) -> None:
    """One UserWarning per key that is set but has no effect (see inactive_keys)."""
    for key, value, reason in inactive_keys(root):
        warnings.warn(f"{key}={_show(value)} has no effect: {reason}", stacklevel=3)
