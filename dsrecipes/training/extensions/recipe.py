"""The recipe's own extensions, in the one order they are applied: what the Trainer adds for a config.

    extensions = build_extensions(cfg)     # compression, then data efficiency, then MoE, then the profilers

Order matters where two contribute to the same point: model transforms run compression (layer
reduction, fake quantization, pruning wrappers) before random-LTD wraps block forwards; loss terms
add distillation before the MoE auxiliary losses; callbacks are told in this order. Kernel
injection, sparse attention and activation checkpointing are not extensions: they are steps of
`dsrecipes.distributed.parallelize`, so they apply on the library path too.
"""

from __future__ import annotations

from dsrecipes.training.extensions.base import ExtensionBuilder, Extensions
from dsrecipes.training.extensions.compression_extension import compression_extension
from dsrecipes.training.extensions.data_efficiency_extension import data_efficiency_extension
from dsrecipes.training.extensions.moe_extension import moe_extension
from dsrecipes.training.extensions.profiling_extension import profiling_extension
from dsrecipes.training.preference.objective import dpo_extension

RECIPE_EXTENSIONS: tuple[ExtensionBuilder, ...] = (compression_extension, data_efficiency_extension, moe_extension,
                                                   dpo_extension, profiling_extension)


def build_extensions(cfg) -> Extensions:
    """Everything the recipe's extension builders contribute for `cfg`, concatenated in RECIPE_EXTENSIONS order."""
    extensions = Extensions()
    for builder in RECIPE_EXTENSIONS:
        extensions.extend(builder(cfg))
    return extensions
