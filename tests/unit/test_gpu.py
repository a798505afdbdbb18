"""GPU tier (skipped without CUDA): the recipe on a real device, in bf16, and CPU/GPU agreement."""

import json

import pytest
import torch

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.models import GPT, ModelConfig
from dsrecipes.training.trainer import Trainer

pytestmark = pytest.mark.gpu


def test_recipe_trains_on_cuda_in_bf16(tmp_path, fast_overrides):
    overrides = fast_overrides + ["precision=bf16", "trainer.device=cuda", "trainer.max_steps=40"]
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    trainer = Trainer(root, tmp_path, batch, overrides=overrides)
    summary = trainer.fit()
    assert trainer.device.type == "cuda"
    assert summary["metrics"]["train/loss"] < summary["metrics"]["train/first_loss"] - 1.0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert all(r["mem/peak_gib"] > 0 for r in train)
    assert "fused" in trainer.engine.optimizer.defaults and trainer.engine.optimizer.defaults["fused"]


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_cuda_fp32_forward_and_grads_match_cpu(style):
    """Same weights and batch: CUDA fp32 (TF32 off) matches CPU within 1e-4 (reduction-order noise)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    cfg = ModelConfig(style=style, n_layer=2, n_head=4, n_kv_head=2 if style == "llama" else None,
                      d_model=128, vocab_size=320, max_seq_len=256, bias=style == "gpt2")
    cpu_model = GPT(cfg)
    gpu_model = GPT(cfg).cuda()
    gpu_model.load_state_dict(cpu_model.state_dict())
    ids = torch.randint(0, 320, (4, 256))
    cpu_out = cpu_model(ids, labels=ids)
    gpu_out = gpu_model(ids.cuda(), labels=ids.cuda())
    cpu_out.loss.backward()
    gpu_out.loss.backward()
    torch.testing.assert_close(gpu_out.logits.cpu(), cpu_out.logits, rtol=1e-4, atol=1e-4)
    for (name, p_cpu), p_gpu in zip(cpu_model.named_parameters(), gpu_model.parameters()):
        torch.testing.assert_close(p_gpu.grad.cpu(), p_cpu.grad, rtol=1e-3, atol=1e-5, msg=name)
