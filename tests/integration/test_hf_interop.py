"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_hf_interop.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tokenizers")

from dsrecipes.config import validate_recipe  # noqa: E402
from dsrecipes.config.store import compose  # noqa: E402
from dsrecipes.models import load_exported  # noqa: E402
from dsrecipes.training.trainer import Trainer  # noqa: E402
from tests.unit.test_hf_interop import SEQ, hf_checkpoint, ids, transformers  # noqa: E402

transformers.logging.set_verbosity_error()


@pytest.mark.slow
def test_model_hf_fine_tunes_an_hf_checkpoint_and_exports_it_back(tmp_path, fast_overrides):
    path, hf = hf_checkpoint(tmp_path / "llama", "llama")
    overrides = [o for o in fast_overrides if not o.startswith("model")] + ["model=hf", f"model.path={path}"]
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    assert (root.model.n_kv_head, root.model.rope_theta, root.data.block_size) == (2, 1234.0, SEQ)

    trainer = Trainer(root, tmp_path / "run", batch, overrides=overrides)
    trainer.setup()  # the weights and the tokenizer are the checkpoint's
    assert trainer.data.tokenizer.name == str((path / "tokenizer.json").resolve())
    with torch.no_grad():
        torch.testing.assert_close(trainer.gpt.eval()(ids()).logits, hf(ids()).logits, rtol=0, atol=1e-5)

    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    summary = Trainer(root, tmp_path / "run2", batch, overrides=overrides).fit()
    metrics = summary["metrics"]
    assert metrics["train/loss"] < metrics["train/first_loss"] - 0.5
    tuned = transformers.AutoModelForCausalLM.from_pretrained(summary["export"]).eval()
    mine, _ = load_exported(summary["export"])
    with torch.no_grad():
        torch.testing.assert_close(tuned(ids()).logits, mine(ids()).logits, rtol=0, atol=1e-5)
        assert not torch.allclose(tuned(ids()).logits, hf(ids()).logits, atol=1e-3)  # it did train
