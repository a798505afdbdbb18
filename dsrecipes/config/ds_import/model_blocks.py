"""DeepSpeed blocks that reshape the model: compression_training and sparse_attention.

compression_training goes through the compression library's own reader
(dsrecipes.compression.config.from_deepspeed, which applies DeepSpeed's defaults and checks the
values): each technique present becomes its whole `compression.<technique>` section, and each
DeepSpeed key is reported against the field it fills. Keys with no field: quantizer_kernel and
quantize_verbose (no effect), quantize_weight_in_forward (dsrecipes always quantizes in the
forward), fp16_mixed_quantize (refused when enabled: it mixes fp16 and quantized weights while the
bits ramp down). DeepSpeed 0.19.7 removed its compression library; the block is read as 0.19.6 did.

sparse_attention maps key by key onto the sparse_attention group, with DeepSpeed's JSON defaults
for the keys left out (mode fixed, attention bidirectional: the layout; dsrecipes' GPT stays causal).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from enum import Enum
from typing import Any

from dsrecipes.config.ds_import.rules import Custom, Rule, To
from dsrecipes.config.ds_import.translation import Translation

_NO_FIELD: dict[str, str] = {
    "quantizer_kernel": "a kernel speed option",
    "quantize_verbose": "a log option",
    "quantize_weight_in_forward": "dsrecipes always quantizes the weights in the forward",
}


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    return list(value) if isinstance(value, (list, tuple)) else value


def read_compression(t: Translation, key: str, block: Any) -> None:
    from dsrecipes.compression.config import CompressionConfig, from_deepspeed

    if not isinstance(block, Mapping):
        t.refused(key, block, "DeepSpeed's compression_training is a block of techniques")
        return
    try:
        cfg = from_deepspeed({"compression_training": dict(block)})
    except (ValueError, TypeError) as error:
        t.refused(key, "{...}", str(error))
        return
    known = {f.name for f in fields(CompressionConfig)}
    for technique, tech in block.items():
        section = getattr(cfg, technique)
        target = f"compression.{technique}"
        for name in (f.name for f in fields(section)):
            t.set(f"{target}.{name}", _plain(getattr(section, name)))
        if technique == "layer_reduction":
            for name, value in tech.items():
                t.record(f"{key}.{technique}.{name}", value, "mapped", f"{target}.{name}={_plain(getattr(section, name))}")
            continue
        assert technique in known, technique
        _report_technique(t, f"{key}.{technique}", tech, section, target)


def _report_technique(t: Translation, key: str, tech: Mapping[str, Any], section: Any, target: str) -> None:
    def report(path: str, name: str, value: Any) -> None:
        if hasattr(section, name):
            t.record(path, value, "mapped", f"{target}.{name}={_plain(getattr(section, name))}")
        elif name == "fp16_mixed_quantize":
            enabled = isinstance(value, Mapping) and value.get("enabled") is True
            if enabled:
                t.refused(path, value, "mixing fp16 and quantized weights while the bits ramp is not supported")
            else:
                t.ignored(path, value, "not enabled")
        elif name in _NO_FIELD:
            t.ignored(path, value, _NO_FIELD[name])
        else:
            t.refused(path, value, f"not a key dsrecipes' {target} takes")

    for name, value in (tech.get("shared_parameters") or {}).items():
        report(f"{key}.shared_parameters.{name}", name, value)
    for group, spec in (tech.get("different_groups") or {}).items():
        for name, value in (spec.get("params") or {}).items():
            report(f"{key}.different_groups.{group}.params.{name}", name, value)
        for name in set(spec) - {"params"}:
            report(f"{key}.different_groups.{group}.{name}", name, spec[name])
    for name in set(tech) - {"shared_parameters", "different_groups"}:
        t.refused(f"{key}.{name}", tech[name], "a technique block holds shared_parameters and different_groups")


COMPRESSION_RULE = Custom(read_compression)

_SPARSE_DEFAULTS = {
    "mode": "fixed", "block": 16, "different_layout_per_head": False, "num_local_blocks": 4, "num_global_blocks": 1,
    "attention": "bidirectional", "horizontal_global_attention": False, "num_different_global_patterns": 1,
    "num_random_blocks": 0, "local_window_blocks": [4], "global_block_indices": [0], "global_block_end_indices": None,
    "num_sliding_window_blocks": 3,
}
SPARSE_ATTENTION_TABLE: dict[str, Rule] = {
    key: To(f"sparse_attention.{key}", default=default) for key, default in _SPARSE_DEFAULTS.items()
}
SPARSE_ATTENTION_TABLE["attention"] = To("sparse_attention.attention", default="bidirectional",
                                         note="the layout; dsrecipes' GPT stays causal")
