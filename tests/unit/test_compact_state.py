"""optimizer.state_dtype=bf16 in one process: stochastic rounding (unbiased, reproducible, independent of sharding),
the bf16-moment Adam against torch's AdamW, its state in half the bytes, bitwise resume, and the bad input it refuses.

ZeRO-3 at world 2 against one process is the adamw-bf16-state row of the equivalence table.
"""

from __future__ import annotations

import copy

import pytest
import torch

from dsrecipes.models.gpt import GPT, ModelConfig
from dsrecipes.training.optim.compact_adam import CompactAdam
from dsrecipes.training.optim.optimizer_config import AdamConfig, AdamWConfig, LionConfig, SGDConfig
from dsrecipes.training.optim.optimizers import build_optimizer, validate_optimizer_config
from dsrecipes.training.optim.stochastic_rounding import global_flat_index, noise_bits, round_to_bf16


def test_stochastic_rounding_lands_on_a_neighbour_and_is_unbiased():
    value = torch.full((200_000,), 1.0 + 2**-10)  # a quarter of the way from bf16's 1.0 to its next value 1 + 2^-7
    rounded = round_to_bf16(value, torch.arange(value.numel()), salt=7).float()
    assert set(rounded.unique().tolist()) == {1.0, 1.0 + 2**-7}
    assert rounded.mean().item() == pytest.approx(1.0 + 2**-10, abs=2e-5)  # round-to-nearest would give 1.0
    negative = round_to_bf16(-value, torch.arange(value.numel()), salt=7).float()
    assert torch.equal(negative, -rounded)  # magnitude rounding: symmetric in sign


def test_rounding_noise_is_a_function_of_index_and_salt():
    index = torch.arange(1000)
    assert torch.equal(noise_bits(index, 3), noise_bits(index, 3))
    assert not torch.equal(noise_bits(index, 3), noise_bits(index, 4))
    bits = noise_bits(torch.arange(100_000), 11)
    assert bits.min() >= 0 and bits.max() < 65536 and abs(bits.float().mean().item() - 32767.5) < 400
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0])
    out = round_to_bf16(special, torch.arange(4), 1)
    assert out[0] == float("inf") and out[1] == -float("inf") and out[2].isnan() and out[3] == 0


def test_global_index_of_a_plain_tensor_is_its_flat_index():
    assert torch.equal(global_flat_index(torch.zeros(3, 4)), torch.arange(12).view(3, 4))


def _pair(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Parameter(torch.randn(64, 48)), torch.nn.Parameter(torch.randn(64, 48))


@pytest.mark.parametrize("decoupled", [True, False])
def test_bf16_moments_follow_torch_adam(decoupled):
    """50 steps: within bf16 rounding of torch's Adam / AdamW on fp32 moments (the stochastic rounding is unbiased,
    so the parameters stay close); the moments are bf16, the parameter fp32."""
    ours, theirs = _pair()
    theirs.data.copy_(ours.data)
    compact = CompactAdam([ours], lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, decoupled=decoupled)
    reference = (torch.optim.AdamW if decoupled else torch.optim.Adam)([theirs], lr=1e-2, betas=(0.9, 0.99),
                                                                       weight_decay=0.1)
    for step in range(50):
        grad = torch.randn(64, 48, generator=torch.Generator().manual_seed(step))
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        compact.step()
        reference.step()
    moved = (theirs.detach() - _pair()[0].detach()).abs().mean()
    assert (ours.detach() - theirs.detach()).abs().mean() < 0.02 * moved
    assert compact.state[ours]["exp_avg"].dtype == torch.bfloat16 and ours.dtype == torch.float32
    assert compact.state[ours]["exp_avg_sq"].dtype == torch.bfloat16


def _state_bytes(optimizer):
    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if t.ndim > 0)


def _gpt():
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=2, n_head=2, d_model=32, vocab_size=64, max_seq_len=16))


def _train(model, optimizer, steps, seed=0):
    losses = []
    for step in range(steps):
        tokens = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(seed + step))
        optimizer.zero_grad()
        out = model(tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(out.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_bf16_state_is_half_the_bytes_and_resumes_bitwise():
    """6 steps straight equal 3 steps, a state_dict round trip into a new model and optimizer, and 3 more, bit for bit;
    the state is bf16 and half of fp32 AdamW's bytes."""
    bf16 = AdamWConfig(lr=1e-2, state_dtype="bf16")
    straight_model = _gpt()
    straight = build_optimizer(bf16, straight_model)
    assert isinstance(straight, CompactAdam)
    straight_losses = _train(straight_model, straight, 6)
    model = _gpt()
    optimizer = build_optimizer(bf16, model)
    _train(model, optimizer, 3)
    resumed_model = _gpt()
    resumed_model.load_state_dict(copy.deepcopy(model.state_dict()))
    resumed = build_optimizer(bf16, resumed_model)
    resumed.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert _train(resumed_model, resumed, 3, seed=3) == straight_losses[3:]
    assert all(t.dtype == torch.bfloat16 for s in resumed.state.values() for k, t in s.items() if k != "step")
    fp32_model = _gpt()
    fp32 = build_optimizer(AdamWConfig(lr=1e-2), fp32_model)
    _train(fp32_model, fp32, 1)
    assert 2 * _state_bytes(resumed) == _state_bytes(fp32)


def test_bad_state_dtype_is_refused_by_key():
    validate_optimizer_config(AdamConfig(state_dtype="bf16", adam_w_mode=False))
    with pytest.raises(ValueError, match=r"optimizer.state_dtype=bf16: optimizer=sgd with momentum 0 has no state"):
        validate_optimizer_config(SGDConfig(state_dtype="bf16"))
    with pytest.raises(ValueError, match=r"optimizer.state_dtype=bf16: it is implemented for the Adam family.*lion"):
        validate_optimizer_config(LionConfig(state_dtype="bf16"))
    with pytest.raises(ValueError, match=r"amsgrad=true"):
        validate_optimizer_config(AdamWConfig(state_dtype="bf16", amsgrad=True))
    with pytest.raises(ValueError, match=r"impl=foreach"):
        validate_optimizer_config(AdamWConfig(state_dtype="bf16", impl="foreach"))


def test_adamw8bit_without_torchao_is_refused_naming_the_key(monkeypatch):
    import importlib.util

    from dsrecipes.training.optim.optimizer_config import AdamW8bitConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(ValueError, match=r"^optimizer=adamw8bit needs torchao, which is not installed: pip install "
                                         r"'dsrecipes\[torchao\]'"):
        AdamW8bitConfig().check(None)


def test_adamw8bit_state_bytes_are_its_codes_and_scales():
    from dsrecipes.training.optim.optimizer_config import AdamW8bitConfig
    from dsrecipes.training.optim.state_bytes import optimizer_state_of

    counted = optimizer_state_of(AdamW8bitConfig())
    assert counted.per_param == 2 + 8 / 256
    assert counted.description == "adamw8bit, state 2.03 B/param (8-bit moments, fp32 scale per 256 elements)"
