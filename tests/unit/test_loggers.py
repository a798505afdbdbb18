"""Logger group: sinks and their combinations, TensorBoard config text, W&B offline content, closing."""

import json

import pytest
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.training.config import LoggerConfig
from dsrecipes.training.extensions.base import Callback, Extensions
from dsrecipes.training.reporting.loggers import JsonlLogger, MetricLoggers, TensorBoardLogger, wandb_mode
from dsrecipes.training.trainer import Trainer


@pytest.mark.parametrize(
    "option, sinks",
    [("none", []), ("jsonl", [JsonlLogger]), ("tensorboard", [TensorBoardLogger]), ("default", [JsonlLogger, TensorBoardLogger])],
)
def test_logger_options_choose_sinks(tmp_path, option, sinks):
    cfg = OmegaConf.to_object(compose([f"logger={option}"])).logger
    loggers = MetricLoggers(cfg, tmp_path, "run", {})
    assert [type(s) for s in loggers.sinks] == sinks
    loggers.close()


def test_wandb_options_and_combinations_compose():
    assert OmegaConf.to_object(compose(["logger=wandb"])).logger.wandb
    all_sinks = OmegaConf.to_object(compose(["logger=all"])).logger
    assert all_sinks.jsonl and all_sinks.tensorboard and all_sinks.wandb
    combo = OmegaConf.to_object(compose(["logger=tensorboard", "logger.jsonl=true"])).logger
    assert combo.jsonl and combo.tensorboard and not combo.wandb


def test_wandb_is_offline_without_a_key(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode("auto") == "online" and wandb_mode("offline") == "offline"


def test_tensorboard_holds_scalars_and_config_text(tmp_path):
    loggers = MetricLoggers(LoggerConfig(jsonl=False), tmp_path, "run", {"model": {"n_layer": 3}})
    loggers.log({"train/loss": 2.5}, 1)
    loggers.log({"train/loss": 2.0}, 2)
    loggers.log_text("run/layout", "world 1 = pp 1 x dp 1")
    loggers.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 2.5), (2, 2.0)]
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "n_layer: 3" in text
    layout = events.Tensors("run/layout/text_summary")[0].tensor_proto.string_val[0].decode()
    assert layout == "world 1 = pp 1 x dp 1"


class Boom(Callback):
    def on_step_end(self, trainer, step, metrics):
        if step == 6:  # after the step-5 log line
            raise RuntimeError("boom")


def test_loggers_are_closed_when_training_fails(tmp_path, fast_overrides):
    root, batch = validate_recipe(compose(fast_overrides), dp_world_size=1)
    trainer = Trainer(root, tmp_path, batch, extensions=Extensions(callbacks=[Boom()]))
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit()
    assert trainer.loggers.sinks == []
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])  # flushed, complete lines
