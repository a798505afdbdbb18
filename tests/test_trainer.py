"""The recipe Trainer in-process: loss falls, extension points are called, run files are written."""

import json

import pytest
import torch

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.models.config import padded_vocab_size
from dsrecipes.training.extensions import Callback, Extensions, RunContext
from dsrecipes.training.trainer import Trainer


def make_trainer(tmp_path, overrides, extensions=None):
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    return Trainer(root, tmp_path / "run", batch, overrides=overrides, extensions=extensions)


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


def test_recipe_extensions_are_one_ordered_list():
    """No registration by import: the recipe's builders are one tuple, applied in its order."""
    from dsrecipes.training.recipe_extensions import RECIPE_EXTENSIONS, build_extensions

    assert [b.__name__ for b in RECIPE_EXTENSIONS] == ["compression_extension", "data_efficiency_extension",
                                                       "moe_extension", "profiling_extension"]
    root, _ = validate_recipe(compose(["moe=top2", "data_efficiency=random_ltd", "compression=qat_int8"]),
                              dp_world_size=1)
    names = [type(c).__name__ for c in build_extensions(root).callbacks]
    assert names == ["CompressionCallback", "DataEfficiencyCallback", "MoEMetrics"]


class Counting(Callback):
    """Counts steps; its count must survive a resume through the checkpoint."""

    def __init__(self):
        self.steps, self.contexts = 0, set()

    def on_step_end(self, context, step, metrics):
        self.steps += 1
        self.contexts.add(type(context))

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


def test_every_callbacks_state_is_checkpointed_and_restored(tmp_path, fast_overrides):
    first = Counting()
    make_trainer(tmp_path / "a", fast_overrides + ["trainer.max_steps=6"], Extensions(callbacks=[first])).fit()
    assert first.steps == 6 and first.contexts == {RunContext}  # a narrow context, not the Trainer
    checkpoint = next((tmp_path / "a" / "run" / "checkpoints").glob("step_6"))
    second = Counting()
    make_trainer(tmp_path / "b", fast_overrides + ["trainer.max_steps=8", f"trainer.resume={checkpoint}"],
                 Extensions(callbacks=[second])).fit()
    assert second.steps == 8  # 6 restored + 2 more


def test_vocab_size_taken_from_tokenizer_and_padded():
    assert padded_vocab_size(257) == 320 and padded_vocab_size(320) == 320


def test_vocab_smaller_than_tokenizer_is_rejected(tmp_path, fast_overrides):
    trainer = make_trainer(tmp_path, fast_overrides + ["model.vocab_size=100"])
    with pytest.raises(ValueError, match="model.vocab_size=100 is smaller than the tokenizer's 257"):
        trainer.fit()


@pytest.mark.slow
def test_bf16_recipe_trains(tmp_path, fast_overrides):
    summary = make_trainer(tmp_path, fast_overrides + ["precision=bf16", "model=llama_debug", "model.max_seq_len=64",
                                                        "trainer.sample_tokens=0"]).fit()
    assert summary["metrics"]["train/loss"] < summary["metrics"]["train/first_loss"]
    assert "sample" not in summary


def test_final_checkpoint_holds_data_position(tmp_path, fast_overrides):
    trainer = make_trainer(tmp_path, fast_overrides + ["checkpoint.interval=10", "checkpoint.keep_last=2"])
    summary = trainer.fit()
    ckpt_dir = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in ckpt_dir.iterdir() if p.is_dir()) == ["step_10", "step_20"]
    state = torch.load(ckpt_dir / "step_20" / "engine.pt", weights_only=False)
    assert state["global_steps"] == 20
    assert state["client_state"]["data"]["batch_in_epoch"] == 20
    assert summary["checkpoint"].endswith("step_20")
