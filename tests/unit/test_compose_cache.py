"""compose()'s shortcut (dsrecipes.config.compose_cache) gives exactly Hydra's own composition: the same config,
the same flags, the same errors, and a fresh merge when the ConfigStore changes."""

from __future__ import annotations

import json
import time

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from dsrecipes.config import compose_cache
from dsrecipes.config.store import CONFIG_MODULE, compose, register_configs

OVERRIDES = [
    [],
    ["zero.stage=2", "trainer.max_steps=3"],
    ["model=gpt_debug", "model.n_layer=3"],
    ["+experiment=gpt_zero3", "precision=bf16", "optimizer.lr=1e-3"],
    ["optimizer=sgd", "optimizer.momentum=0.5", "lr_scheduler=constant"],
    ["moe=top2", "parallel=tp2", "zero.stage=3"],
    ["+trainer.not_a_schema_key=1"],  # a new key, with +, where the schema allows it
    ["++trainer.max_steps=7"],
    ["optimizer=custom", "+optimizer.gone=1", "~optimizer.gone"],  # a deletion
    ["optimizer=custom", "+optimizer.extra={a: 1, b: [2, 3]}"],
    ["data.max_bytes=300000", "model.max_seq_len=64", "model=gpt_debug"],  # order: values before the group
    ["name=run_${zero.stage}"],  # an interpolation stays unresolved
]

BAD = [
    ["zero.stage=abc"],
    ["~trainer.sample_tokens"],
    ["zero.stagee=2"],
    ["model=no_such_model"],
    ["optimizer=sgd", "optimizer.betas=[0.9,0.99]"],
    ["trainer.max_steps=abc"],
    ["+model=gpt_debug"],
    ["zero.stage=1,2"],
]


def _hydra(overrides):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def _raised(function, overrides):
    try:
        function(list(overrides))
    except Exception as error:  # noqa: BLE001 - the error itself is what is compared
        return type(error), str(error)
    return None


@pytest.mark.parametrize("overrides", OVERRIDES, ids=" ".join)
def test_the_shortcut_composes_what_hydra_composes(overrides):
    expected = _hydra(overrides)
    for _ in range(2):  # once merging, once from the cached merge
        got = compose(list(overrides))
        assert OmegaConf.to_yaml(got) == OmegaConf.to_yaml(expected)
        assert OmegaConf.is_struct(got) and OmegaConf.get_type(got) is OmegaConf.get_type(expected)
        got.trainer.max_steps = 12345  # each caller gets its own copy
    assert compose(list(overrides)).trainer.max_steps == expected.trainer.max_steps


@pytest.mark.parametrize("overrides", BAD, ids=" ".join)
def test_bad_overrides_raise_hydras_own_error(overrides):
    expected = _raised(_hydra, overrides)
    assert expected is not None
    assert _raised(compose, overrides) == expected


def test_storing_a_config_again_under_the_same_name_is_merged_afresh():
    store = ConfigStore.instance()
    try:
        store.store(group="experiment", name="_compose_cache_probe", node={"trainer": {"max_steps": 11}},
                    package="_global_")
        assert compose(["+experiment=_compose_cache_probe"]).trainer.max_steps == 11
        store.store(group="experiment", name="_compose_cache_probe", node={"trainer": {"max_steps": 22}},
                    package="_global_")
        assert compose(["+experiment=_compose_cache_probe"]).trainer.max_steps == 22
    finally:
        del store.repo["experiment"]["_compose_cache_probe.yaml"]
        compose_cache.clear()


def test_hydra_overrides_and_sweeps_are_left_to_hydra():
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        assert compose_cache.split_overrides(["hydra.job.chdir=true"]) is None
        assert compose_cache.split_overrides(["hydra/sweeper=basic"]) is None
        assert compose_cache.split_overrides(["zero.stage=1,2"]) is None
        groups, values = compose_cache.split_overrides(["model=gpt_debug", "model.n_layer=2", "+experiment=gpt_tp"])
    assert groups == ["model=gpt_debug", "+experiment=gpt_tp"]
    assert [v.input_line for v in values] == ["model.n_layer=2"]


def test_a_deepspeed_config_edited_between_two_compositions_is_read_again(tmp_path):
    path = tmp_path / "ds.json"
    for stage in (2, 1, 1):  # the unchanged file keeps its stored translation, and its cached merge
        path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage}}))
        assert compose([f"deepspeed_config={path}"]).zero.stage == stage


def test_a_cached_merge_does_not_hand_on_its_resolved_times():
    """Resolver caches are per config (Hydra's `now`, run_stamp): a later composition resolves its own time."""
    first = compose(["name=at_${now:%H-%M-%S}"])
    first_name = first.name
    time.sleep(1.02 - time.time() % 1)  # into the next second
    second = compose(["name=at_${now:%H-%M-%S}"])
    assert second.name != first_name and first.name == first_name
