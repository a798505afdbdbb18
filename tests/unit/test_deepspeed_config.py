"""DeepSpeed configs in (dsrecipes.config.ds_import): translation, report, refusals, the three entry points.

* round trip: each DeepSpeed config of tests/helpers/ds_round_trip.py, through the CLI's
  composition (`deepspeed_config=PATH`), equals its hand-written experiment; together they give
  every key the catalog calls mapped; convert_ds_config's YAML composes to the same config;
* the batch triple against DeepSpeed's own DeepSpeedConfig (fake world size 1/2/4), also under a
  recipe that sets batch keys of its own (a default never counts as given);
* "auto" as Hugging Face's integration resolves it; refused keys, each named in one ValueError;
  the report lists every key of the config;
* load_config / dsrecipes.initialize with a .json path, a DeepSpeed dict, and `deepspeed_config`
  beside dsrecipes keys (those win); one CLI subprocess with an override on top winning;
* the key tables against DeepSpeed's pydantic config models (where DeepSpeed is installed).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from dsrecipes.config.ds_import import load_translation, looks_like_deepspeed, translate
from dsrecipes.config.ds_import.catalog import catalog, counts
from dsrecipes.config.ds_import.report import report_lines
from dsrecipes.config.loading import load_config
from dsrecipes.config.store import compose
from dsrecipes.config.validate import to_root, validate_engine_config, validate_recipe
from tests.helpers.deepspeed_batch import deepspeed_batch
from tests.helpers.ds_round_trip import CASES

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # if DeepSpeed is imported below: its CPU accelerator


def _write(tmp_path: Path, name: str, ds: dict) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(ds, indent=2))
    return path


def _plain(cfg) -> dict:
    out = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
    out.pop("deepspeed_config", None)
    return out


def _experiment_dir(tmp_path: Path, name: str, text: str) -> Path:
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True, exist_ok=True)
    (conf / "experiment" / f"{name}.yaml").write_text(text)
    return conf


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(a) | set(b))
    out = []
    for key in keys:
        path = f"{prefix}{key}"
        if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
            out += _diff(a[key], b[key], path + ".")
        elif a.get(key, "<absent>") != b.get(key, "<absent>"):
            out.append(f"{path}: {a.get(key, '<absent>')!r} != {b.get(key, '<absent>')!r}")
    return out


# ------------------------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("name", sorted(CASES))
def test_deepspeed_config_composes_to_the_hand_written_experiment(name, tmp_path):
    ds, experiment = CASES[name]
    path = _write(tmp_path, name, ds)
    conf = _experiment_dir(tmp_path, name, experiment)
    ours = compose([f"deepspeed_config={path}"])
    hand = compose([f"hydra.searchpath=[file://{conf}]", f"+experiment={name}"])
    assert ours.deepspeed_config == str(path)
    assert not _diff(_plain(ours), _plain(hand)), "\n".join(_diff(_plain(ours), _plain(hand)))


def _normalized(key: str, ds: dict) -> str:
    """A fate's key as the catalog writes it: the type of type-dependent params, no group / metric names."""
    key = re.sub(r"\.different_groups\.[^.]+\.params\.", ".", key)
    key = re.sub(r"\.different_groups\.[^.]+\.", ".", key).replace(".shared_parameters.", ".")
    key = re.sub(r"(curriculum_metrics)\.[^.]+", r"\1.<metric>", key)
    for block in ("optimizer", "scheduler"):
        if key.startswith(f"{block}.params."):
            kind = ds[block]["type"]
            key += f" [{'Lamb' if kind == 'LAMB' else kind}]"
    return key


def test_the_round_trip_cases_give_every_mapped_key():
    given = set()
    for ds, _ in CASES.values():
        given |= {_normalized(f.key, ds) for f in translate(ds).fates if f.kind in ("mapped", "auto")}
    mapped = {key for key, kind in catalog() if kind == "mapped"}
    assert not sorted(mapped - given), f"mapped keys no round-trip case gives: {sorted(mapped - given)}"
    totals = counts()
    assert totals["mapped"] > 150 and totals["no effect"] > 100 and totals["refused"] > 40, totals


def test_convert_ds_config_writes_the_same_experiment(tmp_path, capsys):
    from dsrecipes import convert_ds_config

    name = "fp16_adam_zero3"
    path = _write(tmp_path, name, CASES[name][0])
    assert convert_ds_config.main([str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("# @package _global_\n") and f"python -m dsrecipes +experiment={name}" in out
    assert f"DeepSpeed config {path}:" in err and "0 refused" in err
    conf = _experiment_dir(tmp_path, "mine", out)
    converted = compose([f"hydra.searchpath=[file://{conf}]", "+experiment=mine"])
    assert not _diff(_plain(converted), _plain(compose([f"deepspeed_config={path}"])))


def test_convert_ds_config_refuses_with_the_report_and_no_yaml(tmp_path, capsys):
    from dsrecipes import convert_ds_config

    path = _write(tmp_path, "bad", {"train_batch_size": 8,
                                    "zero_optimization": {"zero_quantized_nontrainable_weights": True}})
    with pytest.raises(SystemExit) as exit_info:
        convert_ds_config.main([str(path)])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == ""
    assert "dsrecipes: error:" in err and "zero_optimization.zero_quantized_nontrainable_weights=true" in err


# ------------------------------------------------------------------------------------------- batch triple


RECIPE_BATCH = {"trainer": {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 6, "gradient_accumulation_steps": 8}}
_TRIPLE = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _triple(ds: dict, world: int, recipe: dict | None = None):
    """The triple the translation of `ds` (over the recipe's trainer keys) resolves to with dsrecipes' rule."""
    from dsrecipes.training.batch import resolve_batch_sizes

    trainer = {**(recipe or {}), **load_translation(ds).values.get("trainer", {})}
    try:
        b = resolve_batch_sizes(*(trainer.get(key) for key in _TRIPLE), dp_world_size=world)
    except ValueError:
        return None
    return b.train_batch_size, b.micro_batch_size, b.gradient_accumulation_steps


def _over(recipe: dict, ds: dict):
    """The DeepSpeed config's translation over a recipe's values, as the CLI composes it (the recipe below)."""
    return OmegaConf.merge(OmegaConf.create(recipe), OmegaConf.create(load_translation(ds, recipe=recipe).as_config()))


def _ours(config, world: int):
    try:
        b = validate_engine_config(to_root(load_config(config)), world)
    except ValueError:
        return None
    return b.train_batch_size, b.micro_batch_size, b.gradient_accumulation_steps


def test_batch_grid_matches_deepspeed_config(monkeypatch):
    checked = 0
    for world in (1, 2, 4):
        for tb in (None, 8, 12, 32, 33):
            for mb in (None, 2, 4, 16, 17):
                for gas in (None, 1, 2, 3):
                    ds = {k: v for k, v in (("train_batch_size", tb), ("train_micro_batch_size_per_gpu", mb),
                                            ("gradient_accumulation_steps", gas)) if v is not None}
                    if not ds:
                        continue
                    theirs = deepspeed_batch(ds, world, monkeypatch)
                    assert _triple(ds, world) == theirs, f"{ds} at dp {world}"
                    # over a recipe that sets all three itself: only the DeepSpeed config's keys count
                    assert _triple(ds, world, RECIPE_BATCH["trainer"]) == theirs, f"{ds} over a recipe"
                    checked += 1
    assert checked == 3 * (5 * 5 * 4 - 1)
    # the whole path (load_config, the engine's validation) on a few of them
    for ds, world in (({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4),
                      ({"train_micro_batch_size_per_gpu": 4}, 2),
                      ({"train_batch_size": 33, "train_micro_batch_size_per_gpu": 16}, 2)):
        assert _ours(ds, world) == _ours(_over(RECIPE_BATCH, ds), world) == deepspeed_batch(ds, world, monkeypatch)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_batch_keys_of_a_composed_recipe_do_not_count_as_given(world, tmp_path, monkeypatch):
    # gpt_zero3 sets train_batch_size 32 and micro 16; each DeepSpeed config gives other keys
    for ds in ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, {"gradient_accumulation_steps": 2,
               "train_batch_size": 64}, {"train_micro_batch_size_per_gpu": 2}):
        path = _write(tmp_path, "ds", ds)
        _, batch = validate_recipe(compose(["+experiment=gpt_zero3", f"deepspeed_config={path}"]), dp_world_size=world)
        assert (batch.train_batch_size, batch.micro_batch_size, batch.gradient_accumulation_steps) == \
            deepspeed_batch(ds, world, monkeypatch), ds


def test_auto_batch_keys_resolve_as_hugging_face():
    recipe = {"trainer": {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4}}
    ds = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
    # HF: micro and accumulation from its arguments (here the recipe's), the global batch computed from them
    assert _ours(_over(recipe, ds), 2) == (8 * 4 * 2, 8, 4)
    assert _ours(_over(recipe, {**ds, "train_micro_batch_size_per_gpu": 2}), 2) == (16, 2, 4)


# ------------------------------------------------------------------------------------------- auto, defaults


def test_auto_values_resolve_as_hugging_face_integration():
    recipe = {"optimizer": {"name": "adamw", "lr": 3e-4, "betas": [0.8, 0.9], "eps": 1e-7, "weight_decay": 0.02},
              "trainer": {"gradient_clipping": 0.4, "max_steps": 77}, "precision": {"dtype": "bf16"},
              "lr_scheduler": {"name": "warmup_decay_lr", "warmup_num_steps": 12}}
    ds = {"gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
          "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                            "warmup_num_steps": "auto", "total_num_steps": "auto"}},
          "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}
    cfg = to_root(load_config({**recipe, "deepspeed_config": ds}))
    assert (cfg.optimizer.lr, list(cfg.optimizer.betas), cfg.optimizer.eps, cfg.optimizer.weight_decay) == \
        (3e-4, [0.8, 0.9], 1e-7, 0.02)
    assert cfg.trainer.gradient_clipping == 0.4 and cfg.precision.dtype == "bf16"
    s = cfg.lr_scheduler
    assert (s.warmup_min_lr, s.warmup_max_lr, s.warmup_num_steps, s.total_num_steps) == (0.0, None, 12, None)
    fates = {f.key: f for f in translate(ds).fates}
    assert fates["scheduler.params.total_num_steps"].kind == "auto" and "trainer.max_steps" in \
        fates["scheduler.params.total_num_steps"].detail
    assert fates["zero_optimization.reduce_bucket_size"].kind == "no effect"


def test_a_block_means_what_it_means_in_deepspeed():
    cfg = to_root(load_config({"optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
                               "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100}},
                               "fp16": {"enabled": True}}))
    o, s, p = cfg.optimizer, cfg.lr_scheduler, cfg.precision
    assert (o.name, list(o.betas), o.eps, o.weight_decay, o.adam_w_mode, o.no_decay_bias_and_norm) == \
        ("adam", [0.9, 0.999], 1e-8, 0.0, True, False)  # FusedAdam's defaults, all parameters decayed
    assert (s.warmup_min_lr, s.warmup_max_lr, s.warmup_num_steps, s.warmup_type, s.step_alignment) == \
        (0.0, 0.001, 1000, "log", "deepspeed")  # WarmupDecayLR's signature defaults
    assert (p.dtype, p.master_weights, p.loss_scale, p.initial_scale_power, p.loss_scale_window, p.hysteresis,
            p.min_loss_scale) == ("fp16", True, 0, 16, 1000, 2, 1)
    torch_adam = to_root(load_config({"optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}))
    assert torch_adam.optimizer.weight_decay == 0.01  # torch.optim.AdamW's own default


def test_a_disabled_precision_block_trains_fp32_and_autocast_maps():
    assert to_root(load_config({"deepspeed_config": {"bf16": {"enabled": False}}, "precision": {"dtype": "bf16"}})
                   ).precision.dtype == "bf16"  # the recipe's own key wins over the translation
    cfg = to_root(load_config({"bf16": {"enabled": False}, "fp16": {"enabled": False, "loss_scale": 128}}))
    assert cfg.precision.dtype == "fp32" and not cfg.precision.master_weights
    auto = to_root(load_config({"torch_autocast": {"enabled": True, "dtype": "float16"}}))
    assert (auto.precision.dtype, auto.precision.master_weights) == ("fp16", False)


# ------------------------------------------------------------------------------------------- refusals


REFUSED = [
    ({"zero_optimization": {"stage": 3, "zero_quantized_nontrainable_weights": True}},
     "zero_optimization.zero_quantized_nontrainable_weights"),
    ({"zero_optimization": {"stage": 3, "zero_quantized_gradients": "yes"}}, "zero_optimization.zero_quantized_gradients"),
    ({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": -2}}, "zero_optimization.zero_hpz_partition_size"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x"},
                            "offload_optimizer": {"device": "nvme", "nvme_path": "/y"}}},
     "zero_optimization.offload_optimizer.nvme_path"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "disk"}}},
     "zero_optimization.offload_optimizer.device"),
    ({"aio": {"use_gds": True}}, "aio.use_gds"),
    ({"zero_optimization": {"stage": 2, "overlap_com": True}}, "zero_optimization.overlap_com"),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage"),
    ({"optimizer": {"type": "MuAdam", "params": {"lr": 1e-3}}}, "optimizer.type"),
    ({"optimizer": {"type": "sgd", "params": {"lr": 1e-3}}}, "optimizer.type"),
    ({"optimizer": {"params": {"lr": 1e-3}}}, "optimizer.type"),
    ({"optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}}, "optimizer.params.max_grad_norm"),
    ({"optimizer": {"type": "Adam", "params": {"amsgrad": True}}}, "optimizer.params.amsgrad"),
    ({"optimizer": {"type": "Adam", "params": {"bias_correction": False}}}, "optimizer.params.bias_correction"),
    ({"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 5}}}, "scheduler.params.total_num_steps"),
    ({"scheduler": {"type": "CosineWarmup", "params": {}}}, "scheduler.type"),
    ({"fp16": {"enabled": True, "fp16_master_weights_and_grads": True}}, "fp16.fp16_master_weights_and_grads"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "bf16.enabled"),
    ({"bf16": {"enabled": True, "bf16_optimizer_states": True}}, "bf16.bf16_optimizer_states"),
    ({"amp": {"enabled": True, "opt_level": "O1"}}, "amp.enabled"),
    ({"gradient_allreduce_op": "sum"}, "gradient_allreduce_op"),
    ({"managed_gradient_accumulation": False}, "managed_gradient_accumulation"),
    ({"elasticity": {"enabled": True, "max_train_batch_size": 64}}, "elasticity.enabled"),
    ({"train_batch_size": 0}, "train_batch_size"),
    ({"train_batch_size": 8, "model": {"n_layer": 2}}, "model"),
    ({"data_efficiency": {"enabled": True, "data_sampling": {"enabled": True, "dynamic_batching": {"enabled": True}}}},
     "data_efficiency.data_sampling.dynamic_batching.enabled"),
    ({"compression_training": {"sparse_pruning": {"shared_parameters": {"enabled": True, "method": "snip_momentum"},
                                                  "different_groups": {}}}}, "compression_training"),
    ({"compression_training": {"weight_quantization": {"shared_parameters": {
        "enabled": True, "fp16_mixed_quantize": {"enabled": True}}, "different_groups": {}}}},
     "compression_training.weight_quantization.shared_parameters.fp16_mixed_quantize"),
    ({"data_types": {"param_dtype": "bf16"}}, "data_types.param_dtype"),
]


@pytest.mark.parametrize("ds, key", REFUSED, ids=[key for _, key in REFUSED])
def test_a_key_dsrecipes_cannot_honour_is_an_error_naming_it(ds, key):
    with pytest.raises(ValueError) as error:
        load_config(ds if looks_like_deepspeed(ds) else {"deepspeed_config": ds})
    message = str(error.value)
    assert f"{key}=" in message and "cannot honour" in message and "\n" not in message, message


def test_keys_deepspeed_does_not_read_are_ignored_with_a_line_and_dsrecipes_keys_get_a_hint():
    t = translate({"train_batch_sise": 32, "_comment": "x", "cuda_visible_devices": "0,1", "comms_config": {}})
    assert not t.refusals
    assert "a typo of train_batch_size?" in t.fate("train_batch_sise").detail
    assert all("DeepSpeed ignores it" in t.fate(key).detail for key in ("_comment", "cuda_visible_devices", "comms_config"))
    assert "deepspeed_config" in translate({"train_batch_size": 8, "model": {}}).fate("model").detail


def test_duplicate_keys_in_the_file_are_refused_as_deepspeed_does(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    with pytest.raises(ValueError, match="duplicate key 'train_batch_size'"):
        load_config(path)


# ------------------------------------------------------------------------------------------- the report


def _leaves(node, prefix=""):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_report_gives_every_key_its_fate(name):
    ds = CASES[name][0]
    t = translate(ds)
    keys = [f.key for f in t.fates]
    missing = [leaf for leaf in _leaves(ds) if not any(leaf == k or leaf.startswith(k + ".") for k in keys)]
    assert not missing, missing
    lines = report_lines(t, f"{name}.json")
    assert lines[0].startswith(f"DeepSpeed config {name}.json: ") and "0 refused" in lines[0]
    assert len(lines) == len(t.fates) + 1 and all(": " in line for line in lines[1:])


# ------------------------------------------------------------------------------------------- entry points


def test_load_config_reads_a_json_path_a_deepspeed_dict_and_deepspeed_config_beside_own_keys(tmp_path):
    ds = {"train_batch_size": 16, "gradient_clipping": 0.3, "optimizer": {"type": "Lamb", "params": {"lr": 0.02}}}
    path = _write(tmp_path, "ds", ds)
    from_path, from_dict = load_config(path), load_config(ds)
    assert from_path.deepspeed_config == str(path) and from_dict.deepspeed_config is None
    assert _plain(from_path) == _plain(from_dict)
    assert (from_path.optimizer.name, from_path.optimizer.lr, from_path.trainer.gradient_clipping) == ("lamb", 0.02, 0.3)
    own = load_config({"deepspeed_config": str(path), "optimizer": {"lr": 0.5}, "trainer": {"gradient_clipping": 2.0}})
    assert (own.optimizer.name, own.optimizer.lr, own.trainer.gradient_clipping) == ("lamb", 0.5, 2.0)
    other = load_config({"deepspeed_config": str(path), "optimizer": {"name": "sgd", "momentum": 0.9}})
    assert other.optimizer.name == "sgd" and other.trainer.train_batch_size == 16  # the DeepSpeed block gives way
    assert load_config(OmegaConf.create(OmegaConf.to_container(own))) == own  # a composed config reloads unchanged


def test_initialize_takes_a_deepspeed_json_and_prints_the_report(tmp_path, capsys):
    import dsrecipes

    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.25,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2}},
          "zero_optimization": {"stage": 0, "overlap_comm": False}}
    path = _write(tmp_path, "ds_config", ds)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
    engine, optimizer, loader, scheduler = dsrecipes.initialize(
        model=torch.nn.Linear(3, 1), config=str(path), training_data=data)
    err = capsys.readouterr().err
    assert err.count(f"DeepSpeed config {path}:") == 1 and "zero_optimization.overlap_comm" in err
    assert (engine.train_batch_size, engine.train_micro_batch_size_per_gpu, engine.gradient_accumulation_steps) == \
        (8, 4, 2) and loader.batch_size == 4
    assert engine.gradient_clipping == 0.25 and isinstance(optimizer, torch.optim.AdamW)
    assert all(group["weight_decay"] == 0.0 for group in optimizer.param_groups)
    for x, y in loader:
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
    assert engine.global_steps == 2


@pytest.mark.parametrize("drop_last, batches", [(True, 2), (False, 3)])
def test_dataloader_drop_last_reaches_the_dataloader_initialize_returns(tmp_path, drop_last, batches):
    """DeepSpeed's dataloader_drop_last: 10 samples at micro-batch 4 are 2 whole micro-batches (the partial third
    dropped) or 3 (DeepSpeed's default: kept)."""
    import dsrecipes

    ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "dataloader_drop_last": drop_last,
          "zero_optimization": {"stage": 0}}
    data = torch.utils.data.TensorDataset(torch.randn(10, 3), torch.randn(10, 1))
    _, _, loader, _ = dsrecipes.initialize(model=torch.nn.Linear(3, 1), config=str(_write(tmp_path, "ds", ds)),
                                           training_data=data)
    assert loader.drop_last is drop_last and len(loader) == batches == len(list(loader))


def test_the_command_line_picks_an_option_over_the_deepspeed_block(tmp_path):
    path = _write(tmp_path, "ds", {"optimizer": {"type": "Lamb", "params": {"lr": 0.02, "max_coeff": 5.0}},
                                   "gradient_clipping": 0.3})
    cfg = compose([f"deepspeed_config={path}", "optimizer=sgd", "optimizer.lr=0.2", "trainer.gradient_clipping=0.9"])
    assert (cfg.optimizer.name, cfg.optimizer.lr, cfg.trainer.gradient_clipping) == ("sgd", 0.2, 0.9)
    with pytest.raises(ValueError, match="one DeepSpeed config per run"):
        compose([f"deepspeed_config={path},{path}"])


def test_cli_refuses_a_deepspeed_config_it_cannot_honour_in_one_line(tmp_path, monkeypatch, capsys):
    from dsrecipes import __main__ as cli

    path = _write(tmp_path, "bad", {"optimizer": {"type": "MuAdam", "params": {}}})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["dsrecipes", f"deepspeed_config={path}"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "optimizer.type=MuAdam" in err[0]
    assert not (tmp_path / "outputs").exists()


# ------------------------------------------------------------------------------------------- tables vs DeepSpeed


def test_the_tables_know_every_key_of_deepspeeds_config_models():
    pytest.importorskip("deepspeed")
    from deepspeed.comm.config import CommsLoggerConfig
    from deepspeed.monitor.config import CometConfig, CSVConfig, TensorBoardConfig, WandbConfig
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig

    known = {key for key, _ in catalog()}
    models = {"zero_optimization": DeepSpeedZeroConfig, "zero_optimization.offload_optimizer":
              DeepSpeedZeroOffloadOptimizerConfig, "zero_optimization.offload_param": DeepSpeedZeroOffloadParamConfig,
              "fp16": DeepSpeedFP16Config, "bf16": DeepSpeedBF16Config, "tensorboard": TensorBoardConfig,
              "wandb": WandbConfig, "csv_monitor": CSVConfig, "comet": CometConfig, "comms_logger": CommsLoggerConfig}
    missing = []
    for prefix, model in models.items():
        for name, info in model.model_fields.items():
            for spelling in {name, info.alias} - {None}:
                if isinstance(info.default, dict) or name in ("offload_param", "offload_optimizer"):
                    continue
                if f"{prefix}.{spelling}" not in known:
                    missing.append(f"{prefix}.{spelling}")
    assert not missing, missing
