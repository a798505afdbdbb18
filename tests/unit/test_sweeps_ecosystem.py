"""Sweeps that work with the ecosystem: optimized_metric (hydra/sweeper=optuna), the multirun summary uncut and with
the optimized metric, TensorBoard HParams and W&B names for sweep jobs, Hydra's job name."""

import csv
import importlib.util
import json

import pytest
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dsrecipes.config.multirun_summary import MultirunSummary
from dsrecipes.config.optimized_metric import SUMMARY_METRICS, check_optimized_metric, optimized_value
from dsrecipes.config.store import compose
from dsrecipes.training.config import LoggerConfig
from dsrecipes.training.reporting.loggers import MetricLoggers, override_hparams, sweep_run_name

SUMMARY = {"overrides": ["optimizer.lr=0.001"], "metrics": {"val/loss": 4.25, "train/loss": 4.0, "val/ppl": 70.1}}


def test_optimized_metric_is_a_root_key_and_hydra_names_the_job_dsrecipes():
    cfg = compose(["optimized_metric=val/loss", "hydra/launcher=slurm"], return_hydra_config=True)
    assert cfg.optimized_metric == "val/loss" and compose([]).optimized_metric is None
    assert cfg.hydra.job.name == "dsrecipes"
    assert cfg.hydra.help.app_name == "dsrecipes"  # `python -m dsrecipes --help`: "dsrecipes is powered by Hydra."
    assert cfg.hydra.launcher.name == "dsrecipes"  # submitit's SLURM job name


def test_optimized_value_from_the_summary_or_the_run_directory(tmp_path):
    assert optimized_value("val/loss", SUMMARY, tmp_path) == 4.25
    # spawned workers / a non-zero rank: no summary came back, it is read from <run dir>/summary.json
    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
    assert optimized_value("train/loss", None, tmp_path) == 4.0
    with pytest.raises(ValueError, match=r"optimized_metric='data/x' is not in this run's summary; its metrics are: "
                                         r"train/loss, val/loss, val/ppl"):
        optimized_value("data/x", SUMMARY, tmp_path)
    with pytest.raises(ValueError, match="wrote no summary.json"):
        optimized_value("val/loss", None, tmp_path / "missing")


def test_a_misspelled_optimized_metric_is_refused_before_training():
    check_optimized_metric(None)
    for name in ("val/loss", "perf/tokens_per_s", "data/tokens_saved"):  # data/...: an extension's, checked at the end
        check_optimized_metric(name)
    with pytest.raises(ValueError, match=r"optimized_metric='val/los' is not a metric of the run summary; choose one of: "
                                         r"val/loss, val/ppl"):
        check_optimized_metric("val/los")
    assert "perf/tokens_per_s" in SUMMARY_METRICS


def _job(sweep, job: int, overrides: list[str], val_loss: float) -> None:
    (sweep / str(job)).mkdir(parents=True)
    summary = {"overrides": overrides, "metrics": {"val/loss": val_loss, "train/loss": val_loss - 0.1}}
    (sweep / str(job) / "summary.json").write_text(json.dumps(summary))


def test_multirun_summary_is_uncut_off_a_terminal_and_shows_the_optimized_metric(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    long = "data.path=/a/very/long/path/to/some/corpus/folder/that/does/not/fit/in/eighty/columns/at/all/train.txt"
    _job(tmp_path, 0, [long, "optimizer.lr=0.001"], 4.5)
    _job(tmp_path, 1, [long, "optimizer.lr=0.003"], 4.25)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}, "optimized_metric": "train/loss"})
    MultirunSummary().on_multirun_end(config)
    out = capsys.readouterr().out  # captured: not a terminal
    assert "train/loss (optimized)" in out and "optimizer.lr=0.003" in out
    assert max(len(line) for line in out.splitlines()) > 80
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[3] == "train/loss"  # first after job, overrides, all_overrides
    assert [float(r["train/loss"]) for r in rows] == [4.4, 4.15] and long in rows[0]["all_overrides"]
    assert "train/loss (optimized)" in (tmp_path / "summary.md").read_text()


def test_sweep_job_writes_tensorboard_hparams_with_its_final_metrics(tmp_path):
    config = {"optimizer": {"lr": 0.001}, "zero": {"stage": 2}, "model": {"name": "gpt_debug"}}
    overrides = ["optimizer.lr=1e-3", "zero.stage=2", "model=gpt_debug", "+experiment=gpt_zero3"]
    assert override_hparams(overrides, config) == {"optimizer.lr": 0.001, "zero.stage": 2, "model": "gpt_debug",
                                                   "experiment": "gpt_zero3"}
    loggers = MetricLoggers(LoggerConfig(jsonl=False), tmp_path, "gpt", config, group="21-40-55_gpt", overrides=overrides)
    loggers.log({"train/loss": 5.0}, 4)
    loggers.log_final({"val/loss": 4.5, "train/steps": 4, "perf/mfu": None})
    loggers.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["optimizer.lr"].number_value == 0.001 and start.hparams["model"].string_value == "gpt_debug"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert sorted(m.name.tag for m in experiment.metric_infos) == ["hparams/train/steps", "hparams/val/loss"]
    assert [(e.step, e.value) for e in events.Scalars("hparams/val/loss")] == [(4, 4.5)]


def test_a_single_run_writes_no_hparams(tmp_path):
    loggers = MetricLoggers(LoggerConfig(jsonl=False), tmp_path, "gpt", {}, overrides=["optimizer.lr=1e-3"])
    loggers.log_final({"val/loss": 4.5}, 1)
    loggers.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert "hparams" not in events.PluginAssets("hparams") and "hparams/val/loss" not in events.Tags()["scalars"]


class _FakeRun:
    def __init__(self):
        self.id, self.summary = "abc123", {}

    def log(self, *args, **kwargs):
        pass

    def finish(self):
        pass


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")
@pytest.mark.parametrize("group, name, job_type", [("21-40-55_gpt", "gpt optimizer.lr=0.001 zero.stage=2", "sweep-job"),
                                                   (None, "gpt", "train")])
def test_wandb_runs_are_named_after_their_overrides_with_a_job_type(tmp_path, monkeypatch, group, name, job_type):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    calls = []
    monkeypatch.setattr(wandb, "init", lambda **kwargs: calls.append(kwargs) or _FakeRun())
    cfg = LoggerConfig(jsonl=False, tensorboard=False, wandb=True)
    loggers = MetricLoggers(cfg, tmp_path, "gpt", {}, group=group, overrides=["optimizer.lr=0.001", "zero.stage=2"])
    (init,) = calls
    assert (init["name"], init["job_type"], init["group"], init["mode"]) == (name, job_type, group, "offline")
    loggers.log_final({"val/loss": 4.5, "perf/mfu": None})
    assert loggers.sinks[0].run.summary == {"final/val/loss": 4.5}
    loggers.close()
    assert len(sweep_run_name("gpt", ["x=" + "1" * 300])) == 128
