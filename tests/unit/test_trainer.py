"""The recipe Trainer in-process: loss falls, extension points are called, run files are written."""


import pytest
import torch

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.models.config import padded_vocab_size
from dsrecipes.training.extensions.base import Callback, Extensions, RunContext
from dsrecipes.training.trainer import Trainer


def make_trainer(tmp_path, overrides, extensions=None):
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    return Trainer(root, tmp_path / "run", batch, overrides=overrides, extensions=extensions)


def test_recipe_extensions_are_one_ordered_list():
    """No registration by import: the recipe's builders are one tuple, applied in its order."""
    from dsrecipes.training.extensions.recipe import RECIPE_EXTENSIONS, build_extensions

    assert [b.__name__ for b in RECIPE_EXTENSIONS] == ["compression_extension", "data_efficiency_extension",
                                                       "moe_extension", "dpo_extension", "profiling_extension"]
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


def test_final_checkpoint_holds_data_position(tmp_path, fast_overrides):
    trainer = make_trainer(tmp_path, fast_overrides + ["checkpoint.interval=10", "checkpoint.keep_last=2"])
    summary = trainer.fit()
    ckpt_dir = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in ckpt_dir.iterdir() if p.is_dir()) == ["step_10", "step_20"]
    state = torch.load(ckpt_dir / "step_20" / "engine.pt", weights_only=False)
    assert state["global_steps"] == 20
    assert state["client_state"]["data"]["batch_in_epoch"] == 20
    assert summary["checkpoint"].endswith("step_20")
