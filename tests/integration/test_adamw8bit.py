"""optimizer=adamw8bit (torchao's AdamW8bit) in one process: it trains a GPT as AdamW does, its state is the 8-bit
codes and scales the estimator counts (~2.03 bytes per parameter, measured on the tensors), and a checkpoint of it
resumes bitwise. In this tier because torchao compiles its step (inductor runs a C++ compiler, a subprocess the unit
tier refuses); about 15 s, most of it the first compile. The refusals are unit tests (tests/unit/test_compact_state.py).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch

from dsrecipes.models.gpt import GPT, ModelConfig
from dsrecipes.training.optim.optimizer_config import AdamW8bitConfig, AdamWConfig
from dsrecipes.training.optim.optimizers import build_optimizer
from dsrecipes.training.optim.state_bytes import held_state_bytes, optimizer_state_of

pytest.importorskip("torchao.optim", reason="torchao (dsrecipes[torchao], in the dev extra) provides AdamW8bit")
pytestmark = pytest.mark.slow

VOCAB = 64


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=2, d_model=64, n_head=4, vocab_size=VOCAB, max_seq_len=32))


def _batch(step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (4, 33), generator=torch.Generator().manual_seed(step % 3))


def _steps(model, optimizer, steps: range) -> list[float]:
    losses = []
    for step in steps:
        ids = _batch(step)
        optimizer.zero_grad(set_to_none=True)
        loss = model(ids[:, :-1], labels=ids[:, 1:]).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.timeout(240)
def test_adamw8bit_trains_like_adamw_in_a_quarter_of_the_state_and_resumes_bitwise():
    cfg = AdamW8bitConfig(lr=3e-3)
    model = _gpt()
    reference = copy.deepcopy(model)
    optimizer = build_optimizer(cfg, model)
    assert type(optimizer).__name__ == "AdamW8bit"
    losses = _steps(model, optimizer, range(12))
    adamw = _steps(reference, build_optimizer(AdamWConfig(lr=3e-3), reference), range(12))
    assert losses[-1] < losses[0] - 0.3  # it trained
    assert losses[-1] == pytest.approx(adamw[-1], abs=0.05)  # as AdamW does, to 8-bit rounding of the moments
    # the state held, per parameter: 8-bit codes and per 256 elements an fp32 scale per moment on the tensors of
    # >= 4096 elements, fp32 moments on the small ones (on this small model their share is large): the estimator's
    # figure, their code tables (2 KiB per quantized tensor) included
    measured = held_state_bytes(optimizer) / sum(p.numel() for p in model.parameters())
    counted = optimizer_state_of(cfg, model).per_param
    assert measured == pytest.approx(counted, rel=1e-3) and counted < 8 * 0.35
    # checkpoint after 6 steps, resume into a fresh model and optimizer: the same bits as the uninterrupted run
    straight, resumed = _gpt(), _gpt()
    first = build_optimizer(cfg, straight)
    _steps(straight, first, range(6))
    saved = io.BytesIO()
    torch.save({"model": straight.state_dict(), "optimizer": first.state_dict()}, saved)
    _steps(straight, first, range(6, 10))
    saved.seek(0)
    state = torch.load(saved, weights_only=False)
    resumed.load_state_dict(state["model"])
    second = build_optimizer(cfg, resumed)
    second.load_state_dict(state["optimizer"])
    _steps(resumed, second, range(6, 10))
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), name
