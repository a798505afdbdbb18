"""loss_curve.png at the end of a run (train and validation loss), and a run without matplotlib: no PNG, one hint."""

import json

import pytest

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.training.reporting import loss_curve
from dsrecipes.training.reporting.loss_curve import LOSS_CURVE_FILE, read_loss_points, write_loss_curve
from dsrecipes.training.trainer import Trainer
from dsrecipes.utils import charts

SHORT = ["trainer.max_steps=4", "trainer.train_micro_batch_size_per_gpu=2", "trainer.log_interval=2", "trainer.eval_interval=2",
         "trainer.eval_batches=1", "trainer.sample_tokens=0", "checkpoint.save_final=false",
         "checkpoint.export_safetensors=false"]


@pytest.mark.skipif(not charts.charts_available(), reason="matplotlib (the charts extra, in dev) not installed")
def test_a_run_ends_with_its_loss_curve(tmp_path, fast_overrides):
    root, batch = validate_recipe(compose(fast_overrides + SHORT), dp_world_size=1)
    Trainer(root, tmp_path, batch).fit()
    png = tmp_path / LOSS_CURVE_FILE
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    points = read_loss_points(tmp_path / "metrics.jsonl")
    assert [step for step, _ in points["train/loss"]] == [2, 4]
    assert [step for step, _ in points["val/loss"]] == [2, 4]


def test_loss_curve_false_draws_no_chart(tmp_path, fast_overrides):
    """trainer.loss_curve=false: the run ends without loss_curve.png (what the equivalence table's runs set)."""
    root, batch = validate_recipe(compose(fast_overrides + SHORT + ["trainer.loss_curve=false"]), dp_world_size=1)
    Trainer(root, tmp_path, batch).fit()
    assert (tmp_path / "summary.json").is_file() and not (tmp_path / LOSS_CURVE_FILE).exists()


def test_without_matplotlib_the_run_ends_and_the_hint_is_logged_once(tmp_path, fast_overrides, monkeypatch):
    monkeypatch.setattr(charts, "charts_available", lambda: False)
    monkeypatch.setattr(charts, "_hinted", False)
    root, batch = validate_recipe(compose(fast_overrides + SHORT + ["logger=none"]), dp_world_size=1)
    trainer = Trainer(root, tmp_path, batch)
    summary = trainer.fit()
    write_loss_curve(tmp_path, trainer.loggers.history)  # a second chart in the same process: no second hint
    assert summary["metrics"]["train/steps"] == 4
    assert not (tmp_path / LOSS_CURVE_FILE).exists()
    assert (tmp_path / "logs" / "rank0.log").read_text().count(charts.CHARTS_HINT) == 1
    # logger=none: no metrics.jsonl, the curve's points are the ones the loggers kept in memory
    assert [step for step, _ in trainer.loggers.history["val/loss"]] == [2, 4]


def test_metrics_jsonl_points_keep_the_last_value_of_a_step_logged_twice(tmp_path, monkeypatch):
    records = [{"step": 1, "train/loss": 5.0}, {"step": 2, "train/loss": 4.0}, {"step": 2, "val/loss": 4.5},
               {"step": 2, "train/loss": 3.9}, {"step": 3, "train/loss": "nan"}]  # step 2 again after a restart
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n{\"step\": 4, \"tra")
    points = read_loss_points(tmp_path / "metrics.jsonl")
    assert points == {"train/loss": [(1, 5.0), (2, 3.9)], "val/loss": [(2, 4.5)]}
    drawn = {}
    monkeypatch.setattr(loss_curve, "write_line_chart", lambda path, series, **kw: drawn.update(series) or path)
    assert write_loss_curve(tmp_path) == tmp_path / LOSS_CURVE_FILE
    assert drawn == {"train loss": [(1, 5.0), (2, 3.9)], "validation loss": [(2, 4.5)]}


def test_benchmark_rows_get_a_bar_chart_of_their_main_figure(tmp_path, monkeypatch):
    from dsrecipes.benchmarks import results
    from dsrecipes.benchmarks.results import BarChart, chart_bars, write_rows

    rows = [{"stage": 1, "dsrecipes_tokens_per_s": 900.0, "deepspeed_tokens_per_s": None},
            {"stage": 2, "dsrecipes_tokens_per_s": 1200.0, "deepspeed_tokens_per_s": 1000.0}]
    chart = BarChart("throughput", "tokens/s", {"dsrecipes_tokens_per_s": "dsrecipes", "deepspeed_tokens_per_s": "deepspeed"},
                     labels=("stage",))
    labels, values, best = chart_bars(rows, chart)
    assert labels == ["stage=1 dsrecipes", "stage=1 deepspeed", "stage=2 dsrecipes", "stage=2 deepspeed"]
    assert values == [900.0, None, 1200.0, 1000.0] and best == 2
    assert chart_bars(rows, BarChart("t", "ms", {"dsrecipes_tokens_per_s": ""}, labels=("stage",), better="min"))[2] == 0
    write_rows(tmp_path, "bench", rows, chart=chart)
    assert (tmp_path / "bench.csv").exists()
    if charts.charts_available():
        assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setattr(charts, "charts_available", lambda: False)  # without matplotlib: the CSV, no PNG
    write_rows(tmp_path, "bench2", rows, chart=chart)
    assert (tmp_path / "bench2.csv").exists() and not (tmp_path / "bench2.png").exists()
    assert results.write_chart(tmp_path, "bench3", rows, chart) is None
