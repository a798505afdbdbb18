"""Composition of every group option and experiment; the schema rejects typos and wrong types."""

import json
from importlib import resources

import pytest
import yaml
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

from dsrecipes.config import CONFIG_GROUPS, load_config, validate_recipe
from dsrecipes.config.inactive import inactive_keys
from dsrecipes.config.loading import to_dictconfig
from dsrecipes.config.store import compose
from dsrecipes.config.validate import to_root
from dsrecipes.training.config import OPTION_SCHEMAS
from dsrecipes.training.optim.lr_scheduler_config import WarmupType
from dsrecipes.training.optim.optimizer_config import OptimizerImpl
from dsrecipes.utils.ranges import check_ranges
from tests.helpers.paths import TEST_DATA

# options that need a key set before they build (their class is the user's choice)
REQUIRED_OVERRIDES = {
    ("data", "hub"): ["data.hub_name=some/dataset"],
    ("model", "hf"): [f"model.path={TEST_DATA / 'hf_gpt2_config'}"],  # its config.json only
    ("optimizer", "custom"): ["optimizer._target_=torch.optim.NAdam"],
    ("lr_scheduler", "custom"): ["lr_scheduler._target_=torch.optim.lr_scheduler.ExponentialLR",
                                 "lr_scheduler.gamma=0.99"],
}


def options(group: str) -> list[str]:
    folder = resources.files("dsrecipes.conf") / group
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def test_default_recipe_composes_and_validates():
    cfg = compose([])
    assert "experiment" not in cfg
    root, batch = validate_recipe(cfg, dp_world_size=1)
    assert root.model.name == "gpt_tiny" and root.data.source == "builtin"
    assert root.data.block_size == root.model.max_seq_len  # interpolation resolved
    assert batch.train_batch_size == 16


@pytest.mark.filterwarnings("ignore:zero.stage=3 with a data-parallel world size of 1")
@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes_and_validates(experiment):
    cfg = compose([f"+experiment={experiment}"])
    nproc = str(cfg.launcher.nproc_per_node)  # the world size the experiment launches (auto: 1 here)
    root, _ = validate_recipe(cfg, dp_world_size=int(nproc) if nproc.isdigit() else 1)
    assert root.name == experiment
    assert inactive_keys(root) == []  # a shipped experiment sets no key its groups do not read


def test_required_experiments_exist():
    assert {"gpt_tiny", "gpt_zero3"} <= set(options("experiment"))
    cfg = compose(["+experiment=gpt_zero3"])
    assert cfg.zero.stage == 3 and cfg.precision.dtype == "auto"  # bf16 where the device is fast at it


@pytest.mark.parametrize("group", [g for g in CONFIG_GROUPS])
def test_every_group_option_composes(group):
    for option in options(group):
        overrides = [f"{group}={option}"] + REQUIRED_OVERRIDES.get((group, option), [])
        root = OmegaConf.to_object(compose(overrides))
        check_ranges(root)  # every numeric value of a shipped option is in range
        assert inactive_keys(root) == [], (group, option)  # and none sits in a group that is off


def test_experiment_files_document_their_command():
    for name in options("experiment"):
        text = (resources.files("dsrecipes.conf") / "experiment" / f"{name}.yaml").read_text()
        assert text.startswith("# @package _global_")
        assert f"python -m dsrecipes +experiment={name}" in text


def test_cli_typo_names_the_full_key():
    with pytest.raises(ConfigCompositionException) as err:
        compose(["model.n_layr=3"])
    assert "model.n_layr" in str(err.value.__cause__) or "n_layr" in str(err.value)


def test_cli_wrong_type_names_the_full_key():
    with pytest.raises(ConfigCompositionException) as err:
        compose(["trainer.max_steps=lots"])
    assert "trainer.max_steps" in str(err.value.__cause__)


def test_unknown_group_option_lists_valid_choices():
    with pytest.raises(MissingConfigException) as err:
        compose(["model=gpt_huge"])
    message = str(err.value)
    assert "gpt_huge" in message and "gpt_tiny" in message and "llama_7b" in message


def _write_experiment(folder, text):
    (folder / "experiment").mkdir(parents=True)
    (folder / "experiment" / "bad.yaml").write_text(text)
    return f"hydra.searchpath=[file://{folder}]"


def test_yaml_typo_names_the_full_key(tmp_path):
    searchpath = _write_experiment(tmp_path, "# @package _global_\noptimizer:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigCompositionException) as err:
        compose([searchpath, "+experiment=bad"])
    assert "full_key: optimizer.learning_rate" in str(err.value)


def test_yaml_wrong_type_names_the_full_key(tmp_path):
    searchpath = _write_experiment(tmp_path, "# @package _global_\ntrainer:\n  seed: not-a-number\n")
    with pytest.raises(ConfigCompositionException) as err:
        compose([searchpath, "+experiment=bad"])
    assert "full_key: trainer.seed" in str(err.value)


@pytest.mark.parametrize(
    "override, message",
    [
        ("optimizer.name=rmsprop", "optimizer.name='rmsprop' does not match the option this config was built from"),
        ("optimizer.lr=0", "optimizer.lr=0.0 must be > 0"),
        ("lr_scheduler.warmup_num_steps=-1", "lr_scheduler.warmup_num_steps=-1 must be >= 1"),
        ("zero.stage=4", "zero.stage=4 is not valid; choose one of: 0, 1, 2, 3"),
        ("trainer.device=tpu", "trainer.device='tpu' is not valid"),
        ("data.block_size=256", "data.block_size=256 exceeds model.max_seq_len=128"),
        ("trainer.gradient_accumulation_steps=3", "trainer.gradient_accumulation_steps=3 alone does not determine the batch"),
    ],
)
def test_cross_field_validation_errors(override, message):
    with pytest.raises(ValueError) as err:
        validate_recipe(compose([override]), dp_world_size=1)
    assert message in str(err.value)


def test_zero_stage_without_workers_warns():
    with pytest.warns(UserWarning, match="nothing to shard"):
        validate_recipe(compose(["zero.stage=2"]), dp_world_size=1)


# ------------------------------------------------------------------------ optimizer / lr_scheduler options


def test_option_groups_default_to_their_first_schema():
    cfg = compose([])
    for group, schemas in OPTION_SCHEMAS.items():
        default = next(iter(schemas))
        assert cfg[group].name == default and OmegaConf.get_type(cfg[group]) is schemas[default]
        assert type(getattr(to_root(load_config({})), group)) is schemas[default]
        assert set(options(group)) == set(schemas), f"conf/{group}/ and OPTION_SCHEMAS['{group}'] differ"


def test_documented_commands_compose():  # docs/precision.md
    cfg = compose(["optimizer=lion", "lr_scheduler=one_cycle"])
    assert (cfg.optimizer._target_, cfg.lr_scheduler._target_) == (
        "dsrecipes.training.optim.lion.Lion", "dsrecipes.training.optim.lr_schedules.OneCycle")
    validate_recipe(cfg, dp_world_size=1)
    custom = compose(["optimizer=custom", "optimizer._target_=torch.optim.RMSprop", "optimizer.alpha=0.9"])
    root, _ = validate_recipe(custom, dp_world_size=1)
    assert root.optimizer.alpha == 0.9
    # the old form, a kwargs dict on the default adamw, fails before training pointing at the new one
    old = compose(["optimizer._target_=torch.optim.RMSprop", "+optimizer.kwargs.alpha=0.9"])
    with pytest.raises(ValueError, match="optimizer.kwargs is not a key of optimizer option 'adamw'.*use optimizer=custom"):
        validate_recipe(old, dp_world_size=1)


def test_a_key_the_option_does_not_take_names_key_and_schema():
    with pytest.raises(ConfigCompositionException) as err:
        compose(["optimizer=adamw", "optimizer.momentum=0.9"])
    assert "Key 'momentum' not in 'AdamWConfig'" in str(err.value.__cause__)
    assert "full_key: optimizer.momentum" in str(err.value.__cause__)
    with pytest.raises(ConfigCompositionException) as err:
        compose(["lr_scheduler=constant", "lr_scheduler.warmup_num_steps=3"])
    assert "Key 'warmup_num_steps' not in 'ConstantConfig'" in str(err.value.__cause__)


@pytest.mark.parametrize(
    "override, message",
    [
        ("optimizer.impl=turbo", "Invalid value 'turbo', expected one of [auto, fused, foreach, for_loop]"),
        ("lr_scheduler.warmup_type=cubic", "Invalid value 'cubic', expected one of [linear, log]"),
        # these were cross-field ValueErrors before their fields became Enums (tests/unit/test_config_enums.py: all of them)
        ("model.style=bert", "Invalid value 'bert', expected one of [gpt2, llama, hf]"),
        ("data.source=web", "Invalid value 'web', expected one of [builtin, files, hub]"),
    ],
)
def test_enum_fields_reject_other_values_at_composition(override, message):
    with pytest.raises(ConfigCompositionException) as err:
        compose([override])
    assert message in str(err.value.__cause__)
    assert f"full_key: {override.split('=')[0]}" in str(err.value.__cause__)


def test_enum_values_behave_as_their_strings():
    root = to_root(compose(["optimizer.impl=foreach", "lr_scheduler.warmup_type=log"]))
    impl, warmup = root.optimizer.impl, root.lr_scheduler.warmup_type
    assert impl is OptimizerImpl.foreach and warmup is WarmupType.log
    assert impl == "foreach" and impl in ("fused", "foreach") and {"foreach": 1}[impl] == 1
    assert f"{impl}" == str(impl) == "foreach" and f"impl={impl!r}" == "impl='foreach'"
    assert json.dumps({"impl": impl}) == '{"impl": "foreach"}'
    assert "impl: foreach" in OmegaConf.to_yaml(compose(["optimizer.impl=foreach"]))
    # what the loggers get: plain strings (yaml.safe_dump refuses Enum objects)
    plain = OmegaConf.to_container(to_dictconfig(root), enum_to_str=True)
    assert "impl: foreach" in yaml.safe_dump(plain) and plain["lr_scheduler"]["warmup_type"] == "log"


def test_to_dictconfig_keeps_custom_arguments(tmp_path):
    """What the trainer writes as a checkpoint's config.yaml loads back into the same optimizer."""
    root = to_root(compose(["optimizer=custom", "optimizer._target_=torch.optim.RMSprop", "optimizer.alpha=0.9"]))
    node = to_dictconfig(root)
    assert node.optimizer.alpha == 0.9
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(node))
    assert to_root(load_config(tmp_path / "config.yaml")).optimizer.extra_arguments == {"alpha": 0.9}
