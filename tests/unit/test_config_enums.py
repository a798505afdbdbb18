"""Every fixed-choice config field is an Enum: a bad value fails at composition naming the key and the choices.

On the command line (dsrecipes.config.store.compose, what `python -m dsrecipes` runs) and through the
library path (load_config(dict), what dsrecipes.initialize(config=dict) runs), before any run directory
or worker exists. A composed recipe survives the trip to the workers (a resolved container) unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from enum import Enum

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from dsrecipes.config import RootConfig, load_config
from dsrecipes.config.store import compose
from dsrecipes.config.validate import to_root
from dsrecipes.training.config import OPTION_SCHEMAS

# full key -> its valid values, in the order the error lists them (every field converted by issue 16;
# an Enum field added later is found in the schema and tested too, its choices taken from its Enum)
CHOICES = {
    "mode": ["train", "generate", "serve-bench"],
    "model.style": ["gpt2", "llama", "hf"],
    "model.impl": ["auto", "native", "transformers"],
    "model.rope_type": ["default", "linear", "llama3"],
    "data.source": ["builtin", "files", "hub"],
    "optimizer.impl": ["auto", "fused", "foreach", "for_loop"],
    "lr_scheduler.warmup_type": ["linear", "log"],
    "precision.dtype": ["fp32", "bf16", "fp16", "auto"],
    "precision.nonfinite_grads": ["error", "skip"],
    "logger.wandb_mode": ["auto", "offline", "online", "disabled"],
    "logger.level": ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
    "zero.offload_optimizer": ["none", "cpu", "nvme"],
    "zero.offload_param": ["none", "cpu", "nvme"],
    "parallel.pp_schedule": ["gpipe", "1f1b", "interleaved_1f1b"],
    "parallel.pp_partition": ["uniform", "parameters"],
    "launcher.backend": ["auto", "nccl", "gloo"],
    "kernels.backend": ["auto", "torch", "triton"],
    "activation_checkpointing.mode": ["none", "full", "every_k"],
    "moe.drop_policy": ["probs", "position"],
    "moe.noisy_gate_policy": ["none", "jitter", "rsample"],
    "moe.dispatch": ["torch", "triton", "einsum"],
    "data_efficiency.curriculum_learning.seqlen_mode": ["truncate", "pack"],
    "data_efficiency.curriculum_learning.difficulty_type": ["value", "percentile"],
    "data_efficiency.curriculum_learning.schedule_type": ["fixed_linear", "fixed_root", "fixed_discrete", "custom"],
    "compression.weight_quantization.quantization_type": ["symmetric", "asymmetric"],
    "compression.weight_quantization.rounding": ["nearest", "stochastic"],
    "compression.activation_quantization.quantization_type": ["symmetric", "asymmetric"],
    "compression.activation_quantization.range_calibration": ["dynamic", "static"],
    "compression.sparse_pruning.method": ["l1", "topk"],
    "compression.sparse_pruning.ramp": ["linear", "cubic"],
    "compression.row_pruning.method": ["l1", "topk"],
    "compression.head_pruning.method": ["l1", "topk"],
    "compression.channel_pruning.method": ["l1", "topk"],
    "sparse_attention.mode": ["none", "dense", "fixed", "variable", "bigbird", "bslongformer", "sliding_window"],
    "sparse_attention.impl": ["auto", "triton", "gathered", "reference"],
    "sparse_attention.attention": ["unidirectional", "bidirectional"],
    "generate.dtype": ["fp32", "bf16", "fp16", "int8"],
    "generate.quant": ["none", "int8", "int4"],
    "generate.bench_impls": ["plain", "engine", "kernels", "int8", "int4", "graph", "int8_graph", "hf"],  # a list
}
BAD = "no-such-choice"


@dataclasses.dataclass(frozen=True)
class EnumField:
    enum_type: type[Enum]
    is_list: bool = False
    option: tuple[str, str] | None = None  # (group, option) of an optimizer / lr_scheduler option's own field

    @property
    def choices(self) -> list[str]:
        return [m.value for m in self.enum_type]


def _enum_fields(cls: type, prefix: str = "", option: tuple[str, str] | None = None) -> dict[str, EnumField]:
    """Full key -> EnumField for every Enum (or list-of-Enum) field of a schema dataclass, recursively."""
    found = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("omegaconf_ignore"):
            continue
        hint = hints[f.name]
        args = typing.get_args(hint)
        is_list = typing.get_origin(hint) is list and bool(args)
        inner = args[0] if is_list else hint
        if isinstance(inner, type) and issubclass(inner, Enum):
            found[prefix + f.name] = EnumField(inner, is_list, option)
        elif dataclasses.is_dataclass(inner):
            found.update(_enum_fields(inner, f"{prefix}{f.name}.", option))
    return found


def _schema_enum_fields() -> dict[str, EnumField]:
    found = _enum_fields(RootConfig)
    for group, schemas in OPTION_SCHEMAS.items():  # every option's own schema; the first option having a key
        for option, schema in reversed(list(schemas.items())):
            found.update(_enum_fields(schema, f"{group}.", (group, option)))
    return found


FIELDS = _schema_enum_fields()


def _overrides(key: str, value: str) -> list[str]:
    field = FIELDS[key]
    chosen = [f"{field.option[0]}={field.option[1]}"] if field.option else []
    return chosen + [f"{key}=[{field.choices[0]},{value}]" if field.is_list else f"{key}={value}"]


def _nested(key: str, value: str) -> dict:
    """{"a": {"b": value}} for key "a.b" (a list field gets [first choice, value]; an option's field its name)."""
    field = FIELDS[key]
    *parents, leaf = key.split(".")
    node: dict = {leaf: [field.choices[0], value] if field.is_list else value}
    if field.option:
        node["name"] = field.option[1]
    for part in reversed(parents):
        node = {part: node}
    return node


def _expected(key: str) -> tuple[str, str]:
    field = FIELDS[key]
    return (f"Invalid value '{BAD}', expected one of [{', '.join(field.choices)}]",
            f"full_key: {key}[1]" if field.is_list else f"full_key: {key}")


def test_the_converted_fields_hold_their_choices():
    assert set(CHOICES) <= set(FIELDS), f"not Enums: {sorted(set(CHOICES) - set(FIELDS))}"
    for key, choices in CHOICES.items():
        assert FIELDS[key].choices == choices, key
    for key, field in FIELDS.items():
        assert all(m.name == m.value for m in field.enum_type), f"{key}: OmegaConf maps strings to members by name"


@pytest.mark.parametrize("key", sorted(FIELDS))
def test_a_bad_value_on_the_command_line_names_the_key_and_the_choices(key):
    with pytest.raises(ConfigCompositionException) as err:
        compose(_overrides(key, BAD))
    message = str(err.value.__cause__)
    invalid, full_key = _expected(key)
    assert invalid in message and full_key in message


@pytest.mark.parametrize("key", sorted(FIELDS))
def test_a_bad_value_through_the_library_names_the_key_and_the_choices(key):
    with pytest.raises(ValidationError) as err:  # a ValueError too
        load_config(_nested(key, BAD))
    invalid, full_key = _expected(key)
    assert invalid in str(err.value) and full_key in str(err.value)


def test_initialize_rejects_a_bad_value_before_building_anything():
    import torch

    import dsrecipes

    message = r"(?s)Invalid value 'fp8', expected one of \[fp32, bf16, fp16, auto\].*full_key: precision.dtype"
    with pytest.raises(ValueError, match=message):
        dsrecipes.initialize(model=torch.nn.Linear(2, 2), config={"precision": {"dtype": "fp8"}})


def _other_values(default) -> list[str]:
    """An override per field of the default recipe setting a valid value other than its default (the last such)."""
    overrides = []
    for key, field in FIELDS.items():
        current = OmegaConf.select(default, key)
        if current is None:  # another option's own field
            continue
        if field.is_list:
            overrides.append(f"{key}=[{','.join(field.choices[-2:])}]")
        else:
            overrides.append(f"{key}={next(v for v in reversed(field.choices) if v != current)}")
    return overrides


def test_every_enum_field_survives_the_trip_to_the_workers():
    default = compose([])
    cfg = compose(_other_values(default))
    container = OmegaConf.to_container(cfg, resolve=True)  # what __main__ hands to spawned workers
    reloaded = load_config(container)
    plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # what loggers and yaml get
    from_yaml = load_config(yaml.safe_load(yaml.safe_dump(plain)))
    checked = 0
    for key, field in FIELDS.items():
        want = OmegaConf.select(cfg, key)
        if want is None:
            continue
        assert want != OmegaConf.select(default, key), key
        for other in (reloaded, from_yaml):
            got = OmegaConf.select(other, key)
            assert got == want, key
            assert all(type(v) is field.enum_type for v in (got if field.is_list else [got])), key
        checked += 1
    assert checked >= len(CHOICES)
    root = to_root(reloaded)
    assert root.parallel.pp_schedule == "interleaved_1f1b" and root.mode == "serve-bench" and root.model.style == "hf"
    assert root.generate.bench_impls == ["int8_graph", "hf"] and root.logger.level == "CRITICAL"
    assert root == to_root(cfg)


def test_enum_members_are_written_as_plain_strings():
    root = to_root(compose(["precision=bf16", "parallel.pp_schedule=interleaved_1f1b", "mode=serve-bench"]))
    text = OmegaConf.to_yaml(OmegaConf.structured(root))  # a checkpoint's config.yaml
    assert "dtype: bf16" in text and "pp_schedule: interleaved_1f1b" in text and "mode: serve-bench" in text
    assert "!!python" not in text and "PrecisionDtype" not in text
    assert json.loads(json.dumps(dataclasses.asdict(root.model)))["style"] == "gpt2"  # an export's config.json
    plain = OmegaConf.to_container(OmegaConf.structured(root), enum_to_str=True)
    assert type(plain["precision"]["dtype"]) is str and type(plain["parallel"]["pp_schedule"]) is str
    assert "dtype: bf16" in yaml.safe_dump(plain)


def test_python_users_may_still_pass_plain_strings():
    from dsrecipes.models import GPT, ModelConfig
    from dsrecipes.models.config import validate_model_config

    cfg = ModelConfig(style="llama", n_layer=1, d_model=32, n_head=2, vocab_size=64)
    GPT(cfg)
    with pytest.raises(ValueError, match="model.style='bert' is not valid; choose one of: gpt2, llama, hf"):
        validate_model_config(ModelConfig(style="bert"))
    assert to_root(load_config(RootConfig(model=cfg))).model.style == "llama"
