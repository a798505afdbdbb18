"""Composition of every group option and experiment; the schema rejects typos and wrong types."""

from importlib import resources

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

from dsrecipes.config import CONFIG_GROUPS, validate_recipe
from dsrecipes.config.store import compose


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


def test_required_experiments_exist():
    assert {"gpt_tiny", "gpt_zero3"} <= set(options("experiment"))
    cfg = compose(["+experiment=gpt_zero3"])
    assert cfg.zero.stage == 3 and cfg.precision.dtype == "bf16"


@pytest.mark.parametrize("group", [g for g in CONFIG_GROUPS])
def test_every_group_option_composes(group):
    for option in options(group):
        overrides = [f"{group}={option}"]
        if group == "data" and option == "hub":
            overrides.append("data.hub_name=some/dataset")
        OmegaConf.to_object(compose(overrides))


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
        ("optimizer.name=rmsprop", "optimizer.name='rmsprop' is not valid; choose one of: adamw"),
        ("lr_scheduler.warmup_type=cubic", "lr_scheduler.warmup_type='cubic' is not valid; choose one of: linear, log"),
        ("zero.stage=4", "zero.stage=4 is not valid; choose one of: 0, 1, 2, 3"),
        ("model.style=bert", "model.style='bert' is not valid; choose one of: gpt2, llama"),
        ("data.source=web", "data.source='web'"),
        ("trainer.device=tpu", "trainer.device='tpu' is not valid"),
        ("data.block_size=256", "data.block_size=256 exceeds model.max_seq_len=128"),
        ("trainer.train_batch_size=33", "33 != 16 x 1 x 1"),
    ],
)
def test_cross_field_validation_errors(override, message):
    with pytest.raises(ValueError) as err:
        validate_recipe(compose([override]), dp_world_size=1)
    assert message in str(err.value)


def test_zero_stage_without_workers_warns():
    with pytest.warns(UserWarning, match="nothing to shard"):
        validate_recipe(compose(["zero.stage=2"]), dp_world_size=1)
