"""dsrecipes.compression: fake quantization, QAT bit schedule, sparse pruning masks and schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from dsrecipes.compression import (
    QuantizationAwareTraining,
    SparsePruner,
    SparsePruningConfig,
    WeightQuantConfig,
    bits_at,
    compute_mask,
    dense_ratio_at,
    fake_quantize,
)
from dsrecipes.kernels.quantization import dequantize_int8_reference, quantize_int8_reference

W = torch.tensor([[0.5, -1.0, 0.25, 0.8], [2.2, -0.3, 0.1, -4.0]])


# --------------------------------------------------------------------------------------------------
# independent scalar-loop quantizer: DeepSpeed's SymQuantizer / AsymQuantizer formulas written out
# with numpy float32 scalars (round-half-even, like torch.round), in DeepSpeed's order of operations
# --------------------------------------------------------------------------------------------------


def _ref_group(vals, bits, symmetric):
    f = np.float32
    vals = [f(v) for v in vals]
    if symmetric:
        half = f(2 ** (bits - 1))
        scale = max(abs(v) for v in vals) / half
        return [float(min(half - 1, max(-half, np.round(v / scale))) * scale) for v in vals]
    lo, hi = min(vals), max(vals)
    scale = (hi - lo) / f(2 ** bits)
    offset = np.round(lo / scale) * scale
    top = f(2 ** bits - 1)
    return [float(min(top, max(f(0.0), np.round((v - offset) / scale))) * scale + offset) for v in vals]


def _ref(w, bits, symmetric, groups):
    flat = w.flatten().tolist()
    n = len(flat) // groups
    out = []
    for g in range(groups):
        out += _ref_group(flat[g * n:(g + 1) * n], bits, symmetric)
    return torch.tensor(out, dtype=torch.float32).reshape(w.shape)


@pytest.mark.parametrize("bits", [8, 4, 3])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_fake_quantize_matches_independent_deepspeed_formula_bit_for_bit(bits, symmetric, groups):
    torch.manual_seed(bits * 10 + groups)
    for w in (W, torch.randn(8, 12) * 0.05 + 0.01):
        got = fake_quantize(w, bits, symmetric=symmetric, groups=groups)
        assert got.shape == w.shape and got.dtype == w.dtype
        assert torch.equal(got, _ref(w, bits, symmetric, groups))


def test_fake_quantize_hand_values_4bit_symmetric_per_tensor():
    # DeepSpeed: scale = max|w| / 2^3 = 0.5, codes clamped to [-8, 7]
    # 0.5 -> 1; -1 -> -2; 0.25 -> 0.5 -> 0 (half to even); 0.8 -> 1.6 -> 2;
    # 2.2 -> 4.4 -> 4; -0.3 -> -0.6 -> -1; 0.1 -> 0; -4 -> -8
    q = torch.tensor([[1, -2, 0, 2], [4, -1, 0, -8]], dtype=torch.float32)
    assert torch.equal(fake_quantize(W, 4, symmetric=True), q * 0.5)
    # the largest positive weight is clipped one step: 4 -> 8 -> 7
    assert torch.equal(fake_quantize(-W, 4, symmetric=True), torch.clamp(-q, max=7) * 0.5)


def test_fake_quantize_hand_values_4bit_asymmetric_per_tensor():
    # raw range [-4, 2.2]: scale = 6.2 / 16 = 0.3875, offset = round(-4 / 0.3875) * 0.3875 = -10 * 0.3875,
    # codes round((w - offset) / scale) clamped to [0, 15]: 2.2 -> 15.68 -> 16 -> 15 (clipped), -4 -> -0.32 -> 0
    scale = torch.tensor(6.2, dtype=torch.float32) / 16
    offset = torch.tensor(-10.0) * scale
    q = torch.tensor([[11, 7, 11, 12], [15, 9, 10, 0]], dtype=torch.float32)
    assert torch.equal(fake_quantize(W, 4, symmetric=False), q * scale + offset)


@pytest.mark.parametrize("bits", [4, 8])
def test_weight_grid_is_deepspeeds_not_the_int8_kernel_grid(bits):
    # DeepSpeed divides max|w| by 2^(bits-1) (the kernel library, by 2^(bits-1) - 1) and does not widen
    # the asymmetric range to include 0
    w = torch.tensor([[0.5, 1.0, 2.0, 3.0]])
    half = 2 ** (bits - 1)
    sym = fake_quantize(w, bits, symmetric=True)
    assert sym[0, 3] == (half - 1) * (3.0 / half)  # max clipped one step below 3.0
    asym = fake_quantize(w, bits, symmetric=False)
    assert asym.min() > 0.25  # range [0.5, 3]: no level at 0
    if bits == 8:  # the kernel library's grid (inference's int8 weights) keeps max|w| exactly
        q, s, z = quantize_int8_reference(w, "symmetric", "channel")
        torch.testing.assert_close(dequantize_int8_reference(q, s, z)[0, 3], torch.tensor(3.0))


def test_fake_quantize_levels_zero_range_groups_and_errors():
    torch.manual_seed(1)
    w = torch.randn(64, 16)
    for bits in (2, 3, 4):
        assert fake_quantize(w, bits, symmetric=True).unique().numel() <= 2 ** bits
        assert fake_quantize(w, bits, symmetric=False).unique().numel() <= 2 ** bits
    assert fake_quantize(w, 3, symmetric=True).unique().numel() == 8  # all 2^bits levels in use
    # zero-range groups (DeepSpeed: NaN) map onto themselves: a pruned (all-zero) row, a constant row
    rows = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.3, 0.3, 0.3, 0.3], [-2.0, -2.0, -2.0, -2.0]])
    assert torch.equal(fake_quantize(rows, 4, symmetric=False, groups=3), rows)
    assert torch.equal(fake_quantize(rows[:1], 4, symmetric=True), rows[:1])
    with pytest.raises(ValueError):
        fake_quantize(w, 4, groups=3)
    with pytest.raises(ValueError):
        fake_quantize(w, 1)
    with pytest.raises(ValueError):
        fake_quantize(w, 4, rounding="up")


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_ste_gradient_is_upstream_gradient(symmetric, rounding):
    torch.manual_seed(2)
    w = torch.randn(8, 8, requires_grad=True)
    upstream = torch.randn(8, 8)
    fake_quantize(w, 3, symmetric=symmetric, groups=2, rounding=rounding).backward(upstream)
    assert torch.equal(w.grad, upstream)


def test_stochastic_rounding_unbiased_and_seeded():
    # every row [-1, 0.3, 1] is its own group. symmetric: scale 1/8; asymmetric: range [-1, 1], scale 1/8,
    # offset -1. 0.3 sits 0.4 of the way from 0.25 to 0.375 either way; -1 is a grid point; 1 is clipped
    w = torch.tensor([-1.0, 0.3, 1.0]).repeat(20000, 1)
    g = torch.Generator().manual_seed(123)
    levels = torch.tensor([0.25, 0.375])
    for symmetric in (True, False):
        out = fake_quantize(w, 4, symmetric=symmetric, groups=20000, rounding="stochastic", generator=g)
        col = out[:, 1]
        assert ((col[:, None] - levels).abs().amin(-1) < 1e-6).all()
        assert abs(col.mean().item() - 0.3) < 2e-3
        assert abs(out[:, 0].mean().item() + 1.0) < 1e-6  # an exact grid point never moves
        assert torch.equal(out[:, 2], torch.full((20000,), 0.875))  # the clamp still applies
    # deterministic with a seeded generator
    a = fake_quantize(w[:100], 4, groups=100, rounding="stochastic", generator=torch.Generator().manual_seed(7))
    b = fake_quantize(w[:100], 4, groups=100, rounding="stochastic", generator=torch.Generator().manual_seed(7))
    c = fake_quantize(w[:100], 4, groups=100, rounding="stochastic", generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


# --------------------------------------------------------------------------------------------------
# bit schedule and QAT
# --------------------------------------------------------------------------------------------------


def test_bit_schedule():
    cfg = WeightQuantConfig(start_bits=8, target_bits=4, quantization_period=10, schedule_offset=5)
    expect = {0: None, 4: None, 5: 8, 14: 8, 15: 7, 24: 7, 25: 6, 35: 5, 44: 5, 45: 4, 46: 4, 1000: 4}
    assert {s: bits_at(cfg, s) for s in expect} == expect
    same = WeightQuantConfig(start_bits=8, target_bits=8)
    assert bits_at(same, 0) == 8 and bits_at(same, 10 ** 6) == 8
    with pytest.raises(ValueError):
        WeightQuantConfig(start_bits=4, target_bits=8)
    with pytest.raises(ValueError):
        WeightQuantConfig(quantization_period=-1)
    at_once = WeightQuantConfig(start_bits=8, target_bits=4, quantization_period=0, schedule_offset=3)
    assert (bits_at(at_once, 2), bits_at(at_once, 3), bits_at(at_once, 100)) == (None, 4, 4)  # period 0: target at once


def test_config_from_deepspeed_block():
    block = {"shared_parameters": {"enabled": True, "quantizer_kernel": False, "schedule_offset": 3,
                                   "quantize_groups": 2, "quantization_type": "asymmetric", "rounding": "nearest"},
             "different_groups": {"wq1": {"params": {"start_bits": 8, "target_bits": 6, "quantization_period": 4},
                                          "modules": ["fc1"]}}}
    cfg = WeightQuantConfig.from_deepspeed(block)
    assert (cfg.start_bits, cfg.target_bits, cfg.quantization_period, cfg.schedule_offset) == (8, 6, 4, 3)
    assert cfg.quantize_groups == 2 and cfg.quantization_type == "asymmetric" and cfg.modules == ["fc1"]
    sp = SparsePruningConfig.from_deepspeed({"shared_parameters": {"method": "l1", "schedule_offset": 2,
                                                                   "block_pattern": "1x1"},
                                             "different_groups": {"sp1": {"params": {"dense_ratio": 0.5}}}})
    assert sp.dense_ratio == 0.5 and sp.schedule_offset_end == 2


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))


def test_qat_selects_modules_and_keeps_state_dict_keys():
    model = _mlp()
    keys = list(model.state_dict().keys())
    qat = QuantizationAwareTraining(model, WeightQuantConfig(start_bits=4, target_bits=4, modules=["0", "2"]))
    assert qat.module_names == ["0", "2"]
    assert list(model.state_dict().keys()) == keys
    assert [n for n, _ in model.named_parameters()] == [k for k in keys]
    x = torch.randn(5, 8)
    assert qat.current_bits() is None
    ref = model[0](x)
    qat.step(0)
    assert qat.current_bits() == 4
    expect = torch.nn.functional.linear(x, fake_quantize(model[0].weight, 4), model[0].bias)
    torch.testing.assert_close(model[0](x), expect)
    assert not torch.allclose(model[0](x), ref)
    # glob / regex matching, and removal restores the float forward
    assert QuantizationAwareTraining(_mlp(), WeightQuantConfig(modules=["[24]"])).module_names == ["2", "4"]
    qat.remove()
    torch.testing.assert_close(model[0](x), ref)
    with pytest.raises(ValueError):
        QuantizationAwareTraining(model, WeightQuantConfig(modules=["nomatch"]))


def test_qat_trains_and_follows_schedule():
    model = _mlp()
    keys = set(model.state_dict().keys())
    cfg = WeightQuantConfig(start_bits=8, target_bits=4, quantization_period=6, schedule_offset=2,
                            quantize_groups=1, rounding="nearest", modules=["*"])
    qat = QuantizationAwareTraining(model, cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = (x[:, :1] * 2 - x[:, 1:2]).tanh()
    losses, bits = [], []
    for step in range(30):
        qat.step(step)
        bits.append(qat.current_bits())
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all()
        opt.step()
        losses.append(loss.item())
    assert bits[:2] == [None, None] and bits[2] == 8 and bits[7] == 8 and bits[8] == 7 and bits[-1] == 4
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert set(model.state_dict().keys()) == keys
    st = qat.state_dict()
    qat2 = QuantizationAwareTraining(_mlp(), cfg)
    qat2.load_state_dict(st)
    assert qat2.current_bits() == 4 and qat2.global_step == 29
    qsd = qat.quantized_state_dict()
    assert set(qsd) == keys
    assert qsd["0.weight"].unique().numel() <= 16  # DeepSpeed's 4-bit symmetric grid: 2^4 levels


def test_qat_stochastic_seeded_reproducible():
    cfg = WeightQuantConfig(start_bits=3, target_bits=3, rounding="stochastic", seed=5, modules=["0"])
    outs = []
    for _ in range(2):
        model = _mlp()
        qat = QuantizationAwareTraining(model, cfg)
        qat.step(0)
        outs.append(model(torch.ones(2, 8)))
    torch.testing.assert_close(outs[0], outs[1])


# --------------------------------------------------------------------------------------------------
# pruning
# --------------------------------------------------------------------------------------------------


def test_dense_ratio_schedule():
    one_shot = SparsePruningConfig(dense_ratio=0.25, schedule_offset=10, block_pattern="1x1")
    assert [dense_ratio_at(one_shot, s) for s in (0, 9, 10, 11, 500)] == [1.0, 1.0, 0.25, 0.25, 0.25]
    ramp = SparsePruningConfig(dense_ratio=0.2, schedule_offset=10, schedule_offset_end=30,
                               schedule_offset_stride=5, block_pattern="1x1")
    got = {s: dense_ratio_at(ramp, s) for s in (9, 10, 14, 15, 20, 29, 30, 100)}
    expect = {9: 1.0, 10: 1.0, 14: 1.0, 15: 0.8, 20: 0.6, 29: 0.4, 30: 0.2, 100: 0.2}
    assert got == pytest.approx(expect)
    cubic = SparsePruningConfig(dense_ratio=0.2, schedule_offset=0, schedule_offset_end=10, ramp="cubic",
                                block_pattern="1x1")
    assert dense_ratio_at(cubic, 5) == pytest.approx(1 - 0.8 * (1 - 0.5 ** 3))
    with pytest.raises(ValueError):
        SparsePruningConfig(schedule_offset=10, schedule_offset_end=5)
    with pytest.raises(ValueError):
        SparsePruningConfig(block_pattern="4-1")


def test_l1_mask_keeps_largest_and_exact_sparsity():
    torch.manual_seed(3)
    w = torch.randn(16, 32)
    mask = compute_mask(w, 0.25, "1x1")
    assert mask.sum().item() == 128
    kept, pruned = w.abs()[mask.bool()], w.abs()[~mask.bool()]
    assert kept.min() >= pruned.max()


def test_4x1_blocks_all_or_nothing():
    torch.manual_seed(4)
    w = torch.randn(16, 8)
    mask = compute_mask(w, 0.5, "4x1")
    blocks = mask.reshape(4, 4, 8)  # [out/4, 4 rows, in]
    assert ((blocks.sum(1) == 0) | (blocks.sum(1) == 4)).all()
    assert mask.mean().item() == 0.5
    # the kept blocks have the largest L1 norms
    norms = w.abs().reshape(4, 4, 8).sum(1)
    keep = blocks[:, 0, :].bool()
    assert norms[keep].min() >= norms[~keep].max()


def test_2_4_keeps_exactly_two_of_four():
    torch.manual_seed(5)
    w = torch.randn(8, 16)
    mask = compute_mask(w, 0.1, "2:4")  # dense_ratio ignored for N:M
    g = mask.reshape(8, 4, 4)
    assert (g.sum(-1) == 2).all()
    a = w.abs().reshape(8, 4, 4)
    kept_min = torch.where(g.bool(), a, torch.full_like(a, math.inf)).amin(-1)
    pruned_max = torch.where(g.bool(), torch.full_like(a, -math.inf), a).amax(-1)
    assert (kept_min >= pruned_max).all()


def _train_with_pruner(cfg, steps):
    model = _mlp()
    pruner = SparsePruner(model, cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    history = []
    for step in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step(step)
        history.append(dict(pruner.sparsity()))
    return model, pruner, history


def test_pruner_schedule_and_masks_stay_applied():
    cfg = SparsePruningConfig(method="l1", dense_ratio=0.25, schedule_offset=5, schedule_offset_end=15,
                              schedule_offset_stride=5, block_pattern="1x1", modules=["0", "2"])
    model, pruner, hist = _train_with_pruner(cfg, 25)
    assert pruner.module_names == ["0", "2"]
    for step in range(5):  # before the offset: no pruning
        assert all(v == 0.0 for v in hist[step].values())
    assert hist[5]["0"] == pytest.approx(0.0, abs=1e-9)  # ramp starts at dense 1.0
    assert hist[10]["0"] == pytest.approx(0.375, abs=1 / 256)
    for step in range(15, 25):  # exact final sparsity, kept through Adam steps
        assert hist[step]["0"] == pytest.approx(0.75, abs=1e-9)
        assert hist[step]["2"] == pytest.approx(0.75, abs=1e-9)
    mask = pruner.masks["2"]
    assert torch.equal(model[2].weight[mask == 0], torch.zeros(int((mask == 0).sum())))
    assert (model[2].weight[mask == 1] != 0).all()
    assert pruner.current_dense_ratio() == 0.25
    # the layer not selected is untouched
    assert (model[4].weight != 0).all()
    # checkpoint round-trip
    other = SparsePruner(_mlp(), cfg)
    other.load_state_dict(pruner.state_dict())
    other.apply_masks()
    assert other.sparsity()["0"] == pytest.approx(0.75)


def test_pruner_2_4_and_4x1_through_training():
    _, p24, hist = _train_with_pruner(SparsePruningConfig(block_pattern="2:4", schedule_offset=3, modules=["2"]), 8)
    assert hist[2]["2"] == 0.0 and hist[3]["2"] == 0.5 and hist[7]["2"] == 0.5
    w = p24.model[2].weight
    assert ((w != 0).reshape(32, 8, 4).sum(-1) <= 2).all()
    _, p41, hist = _train_with_pruner(SparsePruningConfig(block_pattern="4x1", dense_ratio=0.5, schedule_offset=0,
                                                          modules=["0", "2"]), 6)
    w = p41.model[0].weight
    nz = (w != 0).reshape(8, 4, 8).sum(1)
    assert ((nz == 0) | (nz == 4)).all()
    assert hist[-1]["0"] == pytest.approx(0.5)


def test_topk_uses_supplied_scores():
    model = _mlp()
    pruner = SparsePruner(model, SparsePruningConfig(method="topk", dense_ratio=0.5, schedule_offset=0,
                                                     block_pattern="1x1", modules=["0"]))
    scores = torch.arange(model[0].weight.numel(), dtype=torch.float32).reshape(model[0].weight.shape)
    pruner.set_scores("0", scores)
    pruner.step(0)
    assert torch.equal(pruner.masks["0"].bool(), scores >= scores.numel() // 2)
