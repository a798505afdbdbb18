"""The recipe Trainer in-process: loss falls, extension points are called, run files are written."""

import json

import pytest

from dsrecipes.training.extensions.base import Callback, Extensions
from tests.unit.test_trainer import make_trainer


class Recorder(Callback):
    def __init__(self):
        self.events = []

    def on_train_start(self, trainer):
        self.events.append("start")

    def on_step_end(self, trainer, step, metrics):
        self.events.append(("step", step))

    def on_eval_end(self, trainer, step, metrics):
        self.events.append(("eval", step))

    def on_train_end(self, trainer, summary):
        self.events.append("end")


@pytest.mark.slow
def test_training_smoke_loss_falls_and_extensions_fire(tmp_path, fast_overrides):
    recorder, seen_batches, transformed = Recorder(), [], []

    def transform(model):
        transformed.append(type(model).__name__)
        return model

    def hook(batch, step):
        seen_batches.append(step)
        return batch

    def zero_aux_loss(model, batch, output):
        return {"aux_loss": 0.0 * output.logits.float().mean()}

    extensions = Extensions([transform], [zero_aux_loss], [hook], [recorder])
    trainer = make_trainer(tmp_path, fast_overrides + ["trainer.max_steps=40", "trainer.gradient_accumulation_steps=2"],
                           extensions)
    summary = trainer.fit()

    m = summary["metrics"]
    assert m["train/loss"] < m["train/first_loss"] - 1.0, m
    assert m["val/loss"] < 4.5 and m["train/steps"] == 40
    assert transformed == ["GPT"]
    assert len(seen_batches) == 80  # 40 steps x 2 micro-batches
    assert recorder.events[0] == "start" and recorder.events[-1] == "end"
    assert [e for e in recorder.events if isinstance(e, tuple) and e[0] == "eval"] == \
        [("eval", 10), ("eval", 20), ("eval", 30), ("eval", 40)]
    assert summary["sample"].startswith("def ")

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in train] == list(range(5, 45, 5))
    assert all("train/aux_loss" in r and "train/lm_loss" in r for r in train)
    assert {"train/lr", "train/grad_norm", "perf/tokens_per_s"} <= set(train[0])


@pytest.mark.slow
def test_bf16_recipe_trains(tmp_path, fast_overrides):
    summary = make_trainer(tmp_path, fast_overrides + ["precision=bf16", "model=llama_debug", "model.max_seq_len=64",
                                                        "trainer.sample_tokens=0"]).fit()
    assert summary["metrics"]["train/loss"] < summary["metrics"]["train/first_loss"]
    assert "sample" not in summary
