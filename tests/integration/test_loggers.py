"""Logger group: sinks and their combinations, TensorBoard config text, W&B offline content, closing."""

import importlib.util

import pytest

from dsrecipes.training.config import LoggerConfig
from dsrecipes.training.reporting.loggers import MetricLoggers, WandbLogger

needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")


@needs_wandb
def test_wandb_offline_run_holds_metrics_config_name_group_tags(tmp_path, monkeypatch):
    from tests.helpers.wandb_records import read_offline_run_when_written

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = LoggerConfig(jsonl=False, tensorboard=False, wandb=True, wandb_tags=["smoke"])
    loggers = MetricLoggers(cfg, tmp_path, "gpt_tiny", {"model": {"n_layer": 3}}, group="12-00-00_gpt")
    assert isinstance(loggers.sinks[0], WandbLogger)
    loggers.log({"train/loss": 2.5}, 1)
    loggers.log({"train/loss": 2.0, "val/loss": 2.2}, 2)
    loggers.log_text("run/layout", "world 1 = pp 1 x dp 1")
    loggers.close()
    (run_dir,) = list((tmp_path / "wandb").glob("offline-run-*"))
    run = read_offline_run_when_written(run_dir, expected_history=2)
    assert [h["train/loss"] for h in run["history"]] == [2.5, 2.0]
    assert run["history"][1]["val/loss"] == 2.2 and run["history"][1]["_step"] == 2
    assert run["config"]["model"] == {"n_layer": 3}
    assert run["summary"]["run/layout"] == "world 1 = pp 1 x dp 1"
    assert (run["name"], run["group"], run["tags"]) == ("gpt_tiny", "12-00-00_gpt", ["smoke"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wandb"]
