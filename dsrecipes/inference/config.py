"""The `generate` config group: what `python -m dsrecipes mode=generate` and `mode=serve-bench` run.

    python -m dsrecipes mode=generate checkpoint=outputs/<date>/<time>_gpt prompt="Once upon a time"
    python -m dsrecipes mode=generate generate.checkpoint=<run dir> generate.prompts_file=prompts.txt generate.batch_size=8
    python -m dsrecipes mode=serve-bench generate.checkpoint=<run dir> generate.bench_batch_sizes=[1,8]

(`checkpoint=` and `prompt=` are accepted as short forms of generate.checkpoint / generate.prompt
when mode is generate or serve-bench; `checkpoint` alone otherwise names the checkpoint config group.)

The fixed-choice keys (the root `mode`, generate.dtype, generate.quant, generate.bench_impls) are
ConfigEnums, so a bad value fails at composition naming the key and the valid values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

from dsrecipes.utils.config_enum import ConfigEnum, config_enum, enum_values
from dsrecipes.utils.dtypes import DTYPE_NAMES
from dsrecipes.utils.inactive_rules import Inactive
from dsrecipes.utils.ranges import (
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_INT,
    SEED,
    at_least,
    between,
    check_section,
    in_range,
    ranged,
)

# the root `mode` ("serve-bench" is no identifier: the functional form names each member by its value)
RecipeMode = config_enum("RecipeMode", ("train", "generate", "serve-bench"), __name__)
# generate.dtype: the configs' dtype names (dsrecipes.utils.dtypes), or int8 (fp16/bf16 activations + int8 weights)
GenerateDtype = config_enum("GenerateDtype", (*DTYPE_NAMES, "int8"), __name__)


class QuantMode(ConfigEnum):
    """generate.quant: weight-only quantization of the Linear layers."""

    none = "none"
    int8 = "int8"
    int4 = "int4"


class BenchImpl(ConfigEnum):
    """generate.bench_impls: the implementations serve-bench measures (dsrecipes.benchmarks.inference)."""

    plain = "plain"
    engine = "engine"
    kernels = "kernels"
    int8 = "int8"
    int4 = "int4"
    graph = "graph"
    int8_graph = "int8_graph"
    hf = "hf"


RECIPE_MODES = enum_values(RecipeMode)
INFERENCE_MODES = tuple(m for m in RECIPE_MODES if m != "train")
QUANT_CHOICES = enum_values(QuantMode)
DTYPE_CHOICES = enum_values(GenerateDtype)
BENCH_IMPLS = enum_values(BenchImpl)


@dataclass
class GenerateConfig:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, g: root.mode == "train", lambda root, path: "mode=train (the generate group is read by "
                 "mode=generate and mode=serve-bench)"),
        Inactive(lambda root, g: root.mode == "generate", lambda root, path: "mode=generate (bench_* keys are for "
                 "mode=serve-bench)", keys=("bench_batch_sizes", "bench_prompt_len", "bench_new_tokens",
                                            "bench_repeats", "bench_impls")),
    )

    checkpoint: str | None = None  # run dir, checkpoints folder, checkpoints/step_N or safetensors export
    prompt: str | None = None  # one prompt (text)
    prompts_file: str | None = None  # one prompt per line (empty lines skipped), generated in batches
    batch_size: int = ranged(8, POSITIVE_INT)  # prompts per batch from prompts_file
    max_new_tokens: int = ranged(64, COUNT)
    temperature: float = ranged(0.0, NON_NEGATIVE)  # 0 = greedy
    top_k: int = ranged(0, COUNT)  # 0 = off
    top_p: float = ranged(1.0, between(0, 1, low_open=True))  # 1 = off
    repetition_penalty: float = ranged(1.0, POSITIVE)  # 1 = off
    # None = the tokenizer's end-of-sequence id
    stop_tokens: list[int] | None = ranged(None, at_least(0, nullable=True, null_means="the tokenizer's end-of-sequence id"))
    seed: int = ranged(0, SEED)
    stream: bool = True  # print a single prompt's tokens as they are generated
    # also write {"prompt", "completion", "finish_reason"} JSON lines here (relative: to the directory the command runs in)
    output_file: str | None = None
    dtype: GenerateDtype = GenerateDtype.fp32  # fp32 | bf16 | fp16 | int8 (fp16/bf16 activations + int8 weights)
    kernel_inject: bool = False  # fused kernels (needs CUDA; on CPU they fall back to torch references)
    quant: QuantMode = QuantMode.none  # none | int8 | int4 weight-only
    quant_group_size: int = ranged(0, COUNT)  # 0 = per output channel (int8); int4 defaults to 64 when 0
    tp_size: int = ranged(1, POSITIVE_INT)  # tensor-parallel degree: run under torchrun --nproc-per-node tp_size
    cuda_graph: bool = False  # replay the decode step as a CUDA graph (CUDA, tp_size 1, dense models)
    # serve-bench
    bench_batch_sizes: list[int] = field(default_factory=lambda: [1, 8], metadata=in_range(POSITIVE_INT))
    bench_prompt_len: int = ranged(32, POSITIVE_INT)
    bench_new_tokens: int = ranged(32, POSITIVE_INT)
    bench_repeats: int = ranged(3, POSITIVE_INT)
    bench_impls: list[BenchImpl] = field(default_factory=lambda: list(BenchImpl))


def validate_generate_config(cfg: GenerateConfig, mode: str, prefix: str = "generate") -> None:
    """ValueError naming the key, its value and the valid choices."""
    if mode not in RECIPE_MODES:
        raise ValueError(f"mode={mode!r} is not valid; choose one of: {', '.join(RECIPE_MODES)}")
    if mode == "train":
        return

    check_section(cfg, prefix)  # every numeric key: batch sizes >= 1, temperature / top_k >= 0, ...
    if cfg.dtype not in DTYPE_CHOICES:
        raise ValueError(f"{prefix}.dtype={cfg.dtype!r} is not valid; choose one of: {', '.join(DTYPE_CHOICES)}")
    if cfg.quant not in QUANT_CHOICES:
        raise ValueError(f"{prefix}.quant={cfg.quant!r} is not valid; choose one of: {', '.join(QUANT_CHOICES)}")
    for key in ("batch_size", "tp_size", "bench_prompt_len", "bench_new_tokens", "bench_repeats"):
        if getattr(cfg, key) < 1:
            raise ValueError(f"{prefix}.{key}={getattr(cfg, key)} must be >= 1")
    if cfg.max_new_tokens < 0:
        raise ValueError(f"{prefix}.max_new_tokens={cfg.max_new_tokens} must be >= 0")
    if cfg.checkpoint is not None and not os.path.exists(str(cfg.checkpoint)):
        raise FileNotFoundError(f"{prefix}.checkpoint={cfg.checkpoint!r} does not exist; give a run directory, its "
                                "checkpoints folder, a checkpoints/step_N directory or a safetensors export")
    if mode == "serve-bench":
        for key in ("bench_batch_sizes", "bench_impls"):
            if not getattr(cfg, key):
                raise ValueError(f"{prefix}.{key}=[] is empty; mode=serve-bench needs at least one value")
    if mode == "generate":
        if cfg.checkpoint is None:
            raise ValueError(f"mode=generate needs {prefix}.checkpoint (a run dir, checkpoint or export), e.g. "
                             "checkpoint=outputs/<date>/<time>_gpt")
        if (cfg.prompt is None) == (cfg.prompts_file is None):
            raise ValueError(f"mode=generate needs exactly one of {prefix}.prompt and {prefix}.prompts_file "
                             f"(got prompt={cfg.prompt!r}, prompts_file={cfg.prompts_file!r})")
        if cfg.prompts_file is not None and not os.path.isfile(str(cfg.prompts_file)):
            raise FileNotFoundError(f"{prefix}.prompts_file={cfg.prompts_file!r} does not exist")
