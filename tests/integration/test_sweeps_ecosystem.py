"""Sweeps that work with the ecosystem: optimized_metric (hydra/sweeper=optuna), the multirun summary uncut and with
the optimized metric, TensorBoard HParams and W&B names for sweep jobs, Hydra's job name."""

import csv
import importlib.util

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.cli import run_cli


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None,
                    reason="hydra-optuna-sweeper (dev extra) not installed")
def test_optuna_sweep_of_a_tiny_recipe_returns_a_best_value(tmp_path, datasets_cache):
    done = run_cli(["-m", "hydra/sweeper=optuna", "optimized_metric=val/loss", "optimizer.lr=interval(1e-4,1e-2)",
                    "hydra.sweeper.n_trials=3", "hydra.sweeper.sampler.seed=0", "model=gpt_debug", "model.max_seq_len=32",
                    "data.max_bytes=100000", f"data.cache_dir={datasets_cache}", "trainer.max_steps=2",
                    "trainer.train_micro_batch_size_per_gpu=2", "trainer.log_interval=1", "trainer.eval_interval=0",
                    "trainer.eval_batches=1", "trainer.sample_tokens=0", "trainer.progress_bar=false",
                    "lr_scheduler.warmup_num_steps=1", "logger=tensorboard", "checkpoint.save_final=false",
                    "checkpoint.export_safetensors=false"], cwd=tmp_path, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    (results,) = list((tmp_path / "outputs" / "multirun").glob("*/*/optimization_results.yaml"))
    best = yaml.safe_load(results.read_text())
    assert isinstance(best["best_value"], float) and "optimizer.lr" in best["best_params"]
    sweep = results.parent
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and min(float(r["val/loss"]) for r in rows) == pytest.approx(best["best_value"])
    events = EventAccumulator(str(sweep / "0" / "tb"))
    events.Reload()
    assert "hparams/val/loss" in events.Tags()["scalars"]
