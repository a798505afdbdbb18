"""The flops profiler: counts equal torch's FlopCounterMode, the GPT's analytic formula within a stated
tolerance, per-module rows add up, and the recipe writes its profile at profile_step."""


import pytest
import torch
from torch import nn

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.models import GPT
from dsrecipes.models.config import ModelConfig
from dsrecipes.profiling import FlopsProfiler, get_model_profile
from dsrecipes.profiling.flop_formulas import flop_counter

SEQ = 64


def _debug_gpt() -> GPT:
    """model=gpt_debug's shape (4 layers, d 128, 4 heads, biases) on a byte-sized vocabulary."""
    torch.manual_seed(0)
    return GPT(ModelConfig(name="gpt_debug", n_layer=4, n_head=4, d_model=128, max_seq_len=SEQ, vocab_size=256))


def _non_matmul_params(model: GPT) -> int:
    """Parameters in 2N that do no matrix product: biases and norm weights (the counter counts products only)."""
    matmul = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    embeddings = {id(model.tok_emb.weight), id(model.pos_emb.weight)}
    return sum(p.numel() for p in model.parameters() if id(p) not in matmul | embeddings)


def test_forward_flops_equal_flop_counter_and_the_analytic_formula():
    model, ids = _debug_gpt(), torch.randint(0, 256, (2, SEQ))
    flops, macs, params = get_model_profile(model, args=[ids], print_profile=False, as_string=False, warm_up=0)
    with torch.no_grad(), flop_counter() as counter:
        model(ids)
    assert flops == counter.get_total_flops() and macs * 2 == flops and params == model.num_params()

    # GPT.flops_per_token is training (fwd+bwd) = 3 x forward: forward = 2N + 4*L*d*T per token, N the
    # non-embedding parameters. The counter counts matrix products only, so it leaves out 2 FLOPs per bias
    # and norm weight: with those added back the two agree exactly ...
    analytic_forward = model.flops_per_token(SEQ) / 3 * ids.numel()
    assert flops + 2 * _non_matmul_params(model) * ids.numel() == analytic_forward
    # ... and without, within 1%: biases and norms are 13*d of every block's 12*d^2+13*d parameters (0.8% at d=128)
    assert abs(flops - analytic_forward) / analytic_forward < 0.01

    # torch's own registry has no CPU attention kernel: without dsrecipes' formulas the 4*L*d*T term is missing
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as plain:
        model(ids)
    attention = 4 * model.cfg.n_layer * model.cfg.d_model * SEQ * ids.numel()
    assert plain.get_total_flops() in (flops, flops - attention)  # CPU: the latter; a CUDA kernel is registered


def test_module_rows_add_up_and_respect_depth():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4), nn.Linear(4, 2)))
    prof = FlopsProfiler(model)
    prof.start_profile()
    with prof.counting():
        model(torch.ones(3, 8))
    prof.stop_profile()
    assert prof.get_total_flops() == 2 * 3 * (8 * 16 + 16 * 4 + 4 * 2)
    rows = {r.name: r for r in prof.module_rows()}
    assert rows[""].flops == prof.get_total_flops() and rows[""].flops_share == 1.0
    assert rows["2"].flops == rows["2.0"].flops + rows["2.1"].flops and rows["1"].flops == 0
    assert rows["0"].params == 8 * 16 + 16 and rows["0"].macs == 3 * 8 * 16 and rows["0"].calls == 1
    assert {r.name for r in prof.module_rows(module_depth=1)} == {"", "0", "1", "2"}
    top = prof.top_modules(top=1)
    assert top[0] == {"depth": 1, "by_flops": ["0"], "by_latency": top[0]["by_latency"], "by_params": ["0"]}
    assert prof.get_total_flops(as_string=True) == "1.20 KFLOPs"


def test_get_model_profile_needs_an_input():
    with pytest.raises(ValueError, match="input_shape"):
        get_model_profile(nn.Linear(2, 2))


def test_profile_step_beyond_max_steps_fails_before_any_work():
    cfg = compose(["flops_profiler=enabled", "trainer.max_steps=5", "flops_profiler.profile_step=5"])
    with pytest.raises(ValueError, match=r"flops_profiler.profile_step=5 .*trainer.max_steps=5"):
        validate_recipe(cfg, dp_world_size=1)
