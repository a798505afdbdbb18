"""Checkpoints in the recipe: exact resume, auto discovery, atomic saves, mismatch errors, export."""


import pytest
import torch

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.models import load_exported
from dsrecipes.training.extensions.base import Extensions
from dsrecipes.training.trainer import Trainer


def trainer_for(run_dir, overrides, extensions=None):
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    return Trainer(root, run_dir, batch, overrides=overrides, extensions=extensions or Extensions())


@pytest.fixture
def resume_overrides(fast_overrides):
    return fast_overrides + [
        "trainer.max_steps=16", "trainer.log_interval=1", "trainer.gradient_accumulation_steps=2",
        "trainer.eval_interval=4", "checkpoint.interval=8", "model.dropout=0.1", "trainer.sample_tokens=0",
    ]


def test_resume_from_a_missing_path_is_a_clear_error(tmp_path, resume_overrides):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        trainer_for(tmp_path / "run", resume_overrides + [f"trainer.resume={tmp_path / 'nowhere'}"]).fit()


def test_interrupted_save_leaves_the_previous_checkpoint_loadable(tmp_path, resume_overrides, monkeypatch):
    trainer = trainer_for(tmp_path / "run", resume_overrides + ["trainer.max_steps=8"])
    trainer.fit()
    save_dir = tmp_path / "run" / "checkpoints"
    real_save = torch.save

    def dying_save(obj, path, *args, **kwargs):
        if str(getattr(path, "name", path)).endswith("rng_rank0.pt"):  # after the model and optimizer shards are written
            real_save({"partial": True}, path)
            raise KeyboardInterrupt("killed mid-save")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", dying_save)
    trainer.engine.global_steps = 9
    with pytest.raises(KeyboardInterrupt):
        trainer.engine.save_checkpoint(save_dir)
    monkeypatch.setattr(torch, "save", real_save)
    assert (save_dir / "latest").read_text() == "step_8"
    assert not (save_dir / "step_9").exists()
    again = trainer_for(tmp_path / "run2", resume_overrides + [f"trainer.resume={save_dir}"])
    again.setup()
    again.maybe_resume()
    assert again.engine.global_steps == 8


def test_mismatched_checkpoint_names_the_tensor_and_loads_nothing(tmp_path, resume_overrides):
    trainer_for(tmp_path / "small", resume_overrides + ["trainer.max_steps=2"]).fit()
    bigger = trainer_for(tmp_path / "big", resume_overrides + ["model.d_model=192", "model.n_head=4"])
    bigger.setup()
    before = {k: v.clone() for k, v in bigger.engine.module.state_dict().items()}
    with pytest.raises(ValueError, match=r"tensor 'tok_emb.weight' has shape \(320, 128\) in the checkpoint but \(320, 192\)"):
        bigger.engine.load_checkpoint(tmp_path / "small" / "checkpoints")
    assert all(torch.equal(before[k], v) for k, v in bigger.engine.module.state_dict().items())


def test_truncated_checkpoint_is_a_clear_error(tmp_path, resume_overrides):
    trainer = trainer_for(tmp_path / "run", resume_overrides + ["trainer.max_steps=2"])
    trainer.fit()
    (data_file,) = list((tmp_path / "run" / "checkpoints" / "step_2" / "dcp").glob("*.distcp"))
    data_file.write_bytes(data_file.read_bytes()[:1000])
    with pytest.raises(ValueError, match=f"failed verification: dcp/{data_file.name} has 1000 bytes"):
        trainer.engine.load_checkpoint(tmp_path / "run" / "checkpoints")
    # without its manifest (a checkpoint from before manifests) the readers still name the damage
    (tmp_path / "run" / "checkpoints" / "step_2" / "manifest.json").unlink()
    with pytest.raises(ValueError, match="dcp could not be read, it may be truncated or corrupt"):
        trainer.engine.load_checkpoint(tmp_path / "run" / "checkpoints")
    engine_file = tmp_path / "run" / "checkpoints" / "step_2" / "engine.pt"
    engine_file.write_bytes(engine_file.read_bytes()[:100])
    with pytest.raises(ValueError, match="engine.pt is truncated or corrupt"):
        trainer.engine.load_checkpoint(tmp_path / "run" / "checkpoints")


def test_final_export_loads_back_as_the_same_model(tmp_path, resume_overrides):
    trainer = trainer_for(tmp_path / "run",
                          resume_overrides + ["trainer.max_steps=4", "model=llama_debug", "model.max_seq_len=64"])
    summary = trainer.fit()
    model, config = load_exported(summary["export"])
    assert config["tokenizer"] == "byte" and config["model"]["style"] == "llama"
    ids = torch.randint(0, 257, (2, 32))
    trainer.engine.module.eval()
    model.eval()
    torch.testing.assert_close(model(ids).logits, trainer.engine.module(ids).logits)
