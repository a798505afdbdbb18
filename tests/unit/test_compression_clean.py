"""Redundancy clean and export: the cleaned model is smaller by the expected bytes and computes what the
masked / fake-quantized model computed; the export loads back for inference."""

import pytest
import torch

from dsrecipes.compression import (
    QuantizedLinear,
    dequantize_codes,
    fake_quantize,
    init_compression,
    pack_int4,
    quantize_codes,
    state_dict_bytes,
    unpack_int4,
)
from dsrecipes.compression.config import CompressionConfig
from dsrecipes.models import GPT, ModelConfig
from dsrecipes.models.compressed_export import export_compressed, load_compressed

pytestmark = pytest.mark.filterwarnings("ignore:dsrecipes.kernels")


def tiny_gpt():
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=2, n_head=4, d_model=32, vocab_size=64, max_seq_len=16))


def block_linears(model):
    return {n: m for n, m in model.named_modules() if n.startswith("blocks.") and isinstance(m, torch.nn.Linear)}


def test_int4_pack_round_trip_and_codes_are_deepspeeds_grid():
    q = torch.randint(-8, 8, (7, 5))
    assert torch.equal(unpack_int4(pack_int4(q), q.numel()).reshape(7, 5), q.to(torch.int8))
    assert pack_int4(q).numel() == 18
    torch.manual_seed(0)
    w = torch.randn(6, 32)
    for bits in (4, 8):
        sym = quantize_codes(w, bits, True, 6)
        half = 2 ** (bits - 1)
        # each row's max|w| lands on an end code: -half when it is negative, half - 1 (clipped) when positive
        assert sym.zero is None and ((sym.q.amin(1) == -half) | (sym.q.amax(1) == half - 1)).all()
        assert torch.equal(sym.scale, w.abs().amax(1, keepdim=True) / 2 ** (bits - 1))
        asym = quantize_codes(w, bits, False, 6)
        assert asym.q.min() >= 0 and asym.q.max() == 2 ** bits - 1
        for codes, symmetric in ((sym, True), (asym, False)):
            assert torch.equal(dequantize_codes(codes).reshape(w.shape), fake_quantize(w, bits, symmetric, 6))


def test_asymmetric_export_stores_signed_codes_and_a_kernel_zero_point():
    torch.manual_seed(2)
    lin = torch.nn.Linear(16, 4)
    ql = QuantizedLinear.from_linear(lin, 8, symmetric=False, groups=4)
    codes = quantize_codes(lin.weight, 8, False, 4)
    assert torch.equal(ql.int_codes().float().reshape(4, -1), codes.q - 128)
    assert torch.equal(ql.zero_point, -(codes.zero.flatten() + 128).int())
    torch.testing.assert_close(ql.dequantized_weight(), fake_quantize(lin.weight, 8, False, 4), atol=1e-7, rtol=0)


def test_export_of_zero_rows_and_an_unrepresentable_zero_point():
    lin = torch.nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight[1] = 0.0  # a pruned row: its group has zero range
    for sym in (True, False):
        ql = QuantizedLinear.from_linear(lin, 4, symmetric=sym, groups=3)
        assert torch.isfinite(ql.dequantized_weight()).all() and (ql.dequantized_weight()[1] == 0).all()
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[4000.0, 4000.0003, 4000.0, 4000.0]]).repeat(3, 1))  # z ~ 4e9
    with pytest.raises(ValueError, match="zero point.*does not fit int32.*symmetric"):
        QuantizedLinear.from_linear(lin, 8, symmetric=False, groups=3)


@pytest.mark.parametrize("bits,sym,groups", [(8, True, 1), (8, False, 4), (4, True, 64), (4, False, 2), (6, True, 3),
                                             (12, True, 1)])
def test_quantized_linear_equals_fake_quantized_linear(bits, sym, groups):
    torch.manual_seed(1)
    lin = torch.nn.Linear(24, 16)
    ql = QuantizedLinear.from_linear(lin, bits, symmetric=sym, groups=groups)
    x = torch.randn(3, 5, 24)
    expect = torch.nn.functional.linear(x, fake_quantize(lin.weight, bits, sym, groups), lin.bias)
    torch.testing.assert_close(ql(x), expect, atol=1e-5, rtol=1e-5)
    if sym:  # the stored codes hold training's grid points: bit for bit when symmetric
        assert torch.equal(ql.dequantized_weight(), fake_quantize(lin.weight, bits, sym, groups))
    else:  # asymmetric: one fp32 rounding apart (training adds the offset as its own product)
        torch.testing.assert_close(ql.dequantized_weight(), fake_quantize(lin.weight, bits, sym, groups),
                                   atol=1e-7, rtol=0)
    kind = {8: torch.int8, 4: torch.uint8, 6: torch.int8, 12: torch.int16}[bits]
    assert ql.qweight.dtype == kind


def _compress(model, **sections):
    cfg = CompressionConfig()
    for name, values in sections.items():
        sec = getattr(cfg, name)
        sec.enabled = True
        for k, v in values.items():
            setattr(sec, k, v)
    return init_compression(model, cfg, num_heads=4)


@pytest.mark.parametrize("bits,expect_per_weight", [(8, 1.0), (4, 0.5)])
def test_qat_clean_is_smaller_by_expected_bytes_and_same_outputs(tmp_path, bits, expect_per_weight):
    model = tiny_gpt()
    comp = _compress(model, weight_quantization=dict(start_bits=bits, target_bits=bits, quantize_groups=1))
    comp.step(0)
    model.eval()
    x = torch.randint(0, 64, (2, 16))
    ref = model(x, labels=x)
    clean = comp.redundancy_clean()
    out = clean(x, labels=x)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-5)
    lins = block_linears(model)
    before = state_dict_bytes(model)
    weight_numel = sum(m.weight.numel() for m in lins.values())
    expect = before - 4 * weight_numel + int(expect_per_weight * weight_numel) + 4 * len(lins)  # + one fp32 scale each
    assert state_dict_bytes(clean) == expect
    info = export_compressed(clean, tmp_path / "q")
    assert info["bytes"] == expect
    loaded, config = load_compressed(tmp_path / "q")
    assert isinstance(loaded.blocks[1].mlp.fc_out, QuantizedLinear)
    torch.testing.assert_close(loaded(x).logits, ref.logits, atol=1e-5, rtol=1e-5)
    assert config["model"]["n_layer"] == 2


def test_structured_clean_removes_rows_and_heads_same_outputs(tmp_path):
    model = tiny_gpt()
    comp = _compress(model, row_pruning=dict(dense_ratio=0.25, schedule_offset=0),
                     head_pruning=dict(dense_ratio=0.5, schedule_offset=0, method="l1"),
                     sparse_pruning=dict(dense_ratio=0.5, schedule_offset=0, block_pattern="1x1",
                                         modules=["*attn.q_proj"]))
    comp.step(0)
    model.eval()
    x = torch.randint(0, 64, (2, 16))
    ref = model(x).logits
    clean = comp.redundancy_clean()
    b0 = clean.blocks[0]
    assert b0.mlp.fc_in.weight.shape == (32, 32) and b0.mlp.fc_out.weight.shape == (32, 32)
    assert b0.attn.q_proj.weight.shape == (16, 32) and b0.attn.kv_proj.weight.shape == (32, 32)
    assert b0.attn.out_proj.weight.shape == (32, 16) and b0.attn.n_head == 2 and b0.attn.n_kv_head == 2
    torch.testing.assert_close(clean(x).logits, ref, atol=1e-5, rtol=1e-5)
    # removed: 3/4 of the MLP (2 * 128 * 32 weights + 128 bias per layer, kept 32 rows) and half of q/kv/out
    removed_per_layer = 4 * (96 * 32 * 2 + 96 + 16 * 32 + 16 + 32 * 32 + 32 + 32 * 16)
    assert state_dict_bytes(model) - state_dict_bytes(clean) == 2 * removed_per_layer
    export_compressed(clean, tmp_path / "s")
    loaded, _ = load_compressed(tmp_path / "s")
    torch.testing.assert_close(loaded(x).logits, ref, atol=1e-5, rtol=1e-5)
    assert loaded.blocks[1].attn.n_head == 2


def test_combined_prune_then_qat_clean_matches_within_quantization_tolerance(tmp_path):
    model = tiny_gpt()
    comp = _compress(model, row_pruning=dict(dense_ratio=0.5, schedule_offset=0),
                     weight_quantization=dict(start_bits=8, target_bits=8, quantize_groups=4,
                                              quantization_type="asymmetric"),
                     activation_quantization=dict(bits=8, schedule_offset=0, range_calibration="static"))
    comp.step(0)
    x = torch.randint(0, 64, (2, 16))
    model.train()
    model(x)  # calibrates the static activation ranges
    model.eval()
    ref = model(x).logits
    clean = comp.redundancy_clean()
    export_compressed(clean, tmp_path / "c")
    loaded, _ = load_compressed(tmp_path / "c")
    fc_in = loaded.blocks[0].mlp.fc_in
    assert isinstance(fc_in, QuantizedLinear) and fc_in.out_features == 64 and fc_in.act_static
    # groups move when rows are removed: the int8 re-quantization differs by at most ~one level per weight
    err = (loaded(x).logits - ref).abs().max().item()
    assert err < 0.02 * ref.abs().max().item(), err
