"""MoE gating semantics, sparse dispatch, the MoE layer, and an MoE recipe through the Trainer.

Tolerances: gating values are exact formulas on fp32 (compared at 1e-6); the sparse dispatch vs the
dense einsum reference differ only by summation order (1e-6, router gradients 1e-5 of their largest
entry since they sum nearly cancelling terms); the layer vs a per-token loop 1e-5.
"""


import pytest
import torch

from dsrecipes.models import GPT, ModelConfig
from dsrecipes.models.moe import MoELayer, moe_layers
from dsrecipes.models.moe_config import MoEConfig, validate_moe_config
from dsrecipes.models.moe_dispatch import combine, combine_weights, dispatch, einsum_combine, einsum_dispatch
from dsrecipes.models.moe_gating import capacity_for, rank_within_expert, top1_gating, top2_gating, topk_gating

MODEL = ModelConfig(n_layer=2, n_head=2, d_model=16, vocab_size=32, max_seq_len=16)


def one_hot_logits(choices, num_experts, high=4.0):
    """Logits making token s prefer expert choices[s] (then the next ones, in order)."""
    logits = torch.zeros(len(choices), num_experts)
    for s, e in enumerate(choices):
        logits[s, e] = high
        logits[s, (e + 1) % num_experts] = high / 2
    return logits


# ---------------------------------------------------------------- capacity and ranks
def test_capacity_formula():
    assert capacity_for(64, 8, 1.0, 4) == 8
    assert capacity_for(64, 8, 1.25, 4) == 10  # ceil(8 * 1.25)
    assert capacity_for(10, 8, 1.0, 4) == 4  # min_capacity wins
    assert capacity_for(10, 8, 1.0, 0) == 2  # ceil(1.25)


def test_rank_within_expert_counts_earlier_visits_of_the_same_expert():
    expert = torch.tensor([0, 1, 0, 0, 1])
    assert rank_within_expert(expert, torch.arange(5), 2).tolist() == [0, 0, 1, 2, 1]
    assert rank_within_expert(expert, torch.tensor([4, 3, 2, 1, 0]), 2).tolist() == [2, 1, 1, 0, 0]


# ---------------------------------------------------------------- top-1
def test_top1_without_rts_drops_the_tokens_deepspeed_drops():
    # DeepSpeed keeps what torch.topk over the one-hot mask returns among the tied candidates, not the
    # first tokens: of the six tokens wanting expert 0 it keeps 1, 2, 4, 5 (verified against
    # deepspeed 0.19.8 top1gating, use_rts=False, on CPU).
    logits = one_hot_logits([0, 0, 0, 0, 0, 0, 1, 2], num_experts=4)  # 6 tokens want expert 0
    r = top1_gating(logits, capacity_factor=1.0, min_capacity=4, use_rts=False)
    assert r.capacity == 4  # max(ceil(8/4 * 1), 4)
    assert r.expert[:, 0].tolist() == [-1, 0, 0, -1, 0, 0, 1, 2]
    assert r.slot[[1, 2, 4, 5], 0].tolist() == [0, 1, 2, 3]  # slots follow token order among the kept
    assert int(r.dropped) == 2
    assert r.expert_counts.tolist() == [6, 1, 1, 0]  # counted before dropping
    gates = torch.softmax(logits, dim=1)
    kept_prob = gates[torch.arange(8), torch.tensor([0, 0, 0, 0, 0, 0, 1, 2])]
    expected = kept_prob * torch.tensor([0, 1, 1, 0, 1, 1, 1, 1.0])
    torch.testing.assert_close(r.weight[:, 0], expected)  # top-1 weights are not renormalised


@pytest.mark.parametrize("choices,kept", [
    ([0] * 16, [10, 11]),
    ([0] * 8 + [1] * 8, [5, 7, 10, 11]),
    ([s % 4 for s in range(16)], [3, 4, 5, 6, 8, 9, 11, 14]),
    ([2, 0, 2, 1, 3, 3, 0, 1, 3, 2, 1, 1, 2, 2, 3, 2], [0, 1, 5, 6, 7, 8, 11, 13]),  # argmax of randn(16, 4), seed 0
])
def test_top1_without_rts_keeps_deepspeeds_tokens_at_capacity_2(choices, kept):
    """S=16, E=4, capacity 2: the kept tokens deepspeed 0.19.8's top1gating (use_rts=False) keeps on CPU."""
    r = top1_gating(one_hot_logits(choices, num_experts=4), capacity_factor=0.5, min_capacity=2, use_rts=False)
    assert r.capacity == 2
    assert (r.expert[:, 0] >= 0).nonzero().flatten().tolist() == kept
    assert r.expert[kept, 0].tolist() == [choices[s] for s in kept]


def test_top1_without_rts_keeps_every_token_under_capacity():
    r = top1_gating(one_hot_logits([0, 1, 2, 3, 0, 1], num_experts=4), capacity_factor=1.0, min_capacity=2,
                    use_rts=False)
    assert r.expert[:, 0].tolist() == [0, 1, 2, 3, 0, 1] and int(r.dropped) == 0
    assert r.slot[:, 0].tolist() == [0, 0, 0, 0, 1, 1]


def test_top1_random_token_selection_keeps_capacity_tokens_in_token_order_slots():
    torch.manual_seed(0)
    logits = one_hot_logits([0] * 12, num_experts=4)
    r = top1_gating(logits, 1.0, min_capacity=4, use_rts=True)
    kept = (r.expert[:, 0] == 0).nonzero().flatten()
    assert len(kept) == 4  # any 4 of the 12 tokens
    assert r.slot[kept, 0].tolist() == [0, 1, 2, 3]  # slots follow token order among kept ones
    seen = set()
    for seed in range(5):
        torch.manual_seed(seed)
        seen.add(tuple((top1_gating(logits, 1.0, 4, use_rts=True).expert[:, 0] == 0).nonzero().flatten().tolist()))
    assert len(seen) > 1  # random priorities, not positions


def test_top1_aux_loss_matches_hand_computation():
    torch.manual_seed(1)
    logits = torch.randn(20, 5)
    r = top1_gating(logits, 1.0, 4, use_rts=False)
    gates = torch.softmax(logits, 1)
    me = gates.mean(0)
    ce = torch.nn.functional.one_hot(gates.argmax(1), 5).float().mean(0)
    torch.testing.assert_close(r.aux_loss, (me * ce).sum() * 5)
    torch.testing.assert_close(r.z_loss, torch.logsumexp(logits, 1).pow(2).mean())


def test_no_drop_capacity_is_the_busiest_expert():
    logits = one_hot_logits([0] * 7 + [1], num_experts=4)
    r = top1_gating(logits, 1.0, 4, drop_tokens=False)
    assert r.capacity == 7 and int(r.dropped) == 0 and (r.expert[:, 0] >= 0).all()


# ---------------------------------------------------------------- top-2 / top-k
def test_top2_renormalises_the_surviving_pair():
    torch.manual_seed(2)
    logits = torch.randn(6, 4)
    r = top2_gating(logits, capacity_factor=4.0, min_capacity=0, second_expert_sampling=False)
    gates = torch.softmax(logits, 1)
    top = gates.topk(2, dim=1)
    assert r.expert.tolist() == top.indices.tolist()
    torch.testing.assert_close(r.weight, top.values / top.values.sum(1, keepdim=True))


def test_top2_first_choices_take_slots_before_second_choices_and_a_lone_survivor_gets_weight_1():
    logits = one_hot_logits([0, 0, 1, 3], num_experts=4)  # second choices: 1, 1, 2, 0
    r = top2_gating(logits, capacity_factor=0.5, min_capacity=2, second_expert_sampling=False)
    assert r.capacity == 2  # max(ceil(4/4 * 0.5 * 2), 2)
    # expert 0: first choices of tokens 0, 1 fill it; token 3's second choice (expert 0) is dropped
    assert r.expert[:, 0].tolist() == [0, 0, 1, 3]
    assert r.expert[:, 1].tolist() == [1, -1, 2, -1]  # expert 1: token 2's first choice, then token 0's second
    assert r.slot[2, 0] == 0 and r.slot[0, 1] == 1
    torch.testing.assert_close(r.weight[1], torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(r.weight[3], torch.tensor([1.0, 0.0]))


def test_top2_aux_loss_and_topk_aux_loss_match_hand_computation():
    torch.manual_seed(3)
    logits = torch.randn(16, 6)
    gates = torch.softmax(logits, 1)
    me = gates.mean(0)
    ce1 = torch.nn.functional.one_hot(gates.argmax(1), 6).float().mean(0)
    r2 = top2_gating(logits, 1.0, 4, second_expert_sampling=False)
    torch.testing.assert_close(r2.aux_loss, (me * ce1).mean() * 36)
    r3 = topk_gating(logits, 3, 1.0, 4)
    ce3 = torch.zeros(6).scatter_add(0, gates.topk(3, 1).indices.flatten(), torch.ones(48)) / 16
    torch.testing.assert_close(r3.aux_loss, (me * ce3).mean() * 36 / 3)


def test_topk_probs_policy_keeps_the_highest_gates():
    logits = torch.zeros(6, 4)
    logits[:, 0] = torch.tensor([1.0, 5.0, 2.0, 4.0, 3.0, 0.5])  # everyone's top choice is expert 0
    r = topk_gating(logits, 1, capacity_factor=1.0, min_capacity=2, drop_policy="probs")
    assert r.capacity == 2
    assert (r.expert[:, 0] == 0).nonzero().flatten().tolist() == [1, 3]  # gates 5.0 and 4.0
    r = topk_gating(logits, 1, capacity_factor=1.0, min_capacity=2, drop_policy="position")
    assert (r.expert[:, 0] == 0).nonzero().flatten().tolist() == [0, 1]


def test_matches_deepspeed_gating_where_deepspeed_is_installed():
    ds = pytest.importorskip("deepspeed.moe.sharded_moe")
    torch.manual_seed(0)
    logits = torch.randn(64, 8)
    for ours, theirs in [
        (top2_gating(logits.clone(), 1.0, 4, True, second_expert_sampling=False),
         ds.top2gating(logits.clone(), 1.0, 4, drop_tokens=True, top2_2nd_expert_sampling=False)),
        (topk_gating(logits.clone(), 3, 1.0, 4, True, "probs"), ds.topkgating(logits.clone(), 3, 1.0, 4, drop_tokens=True)),
        (top1_gating(logits.clone(), 1.0, 4, True, use_rts=False), ds.top1gating(logits.clone(), 1.0, 4, use_rts=False)),
    ]:
        torch.testing.assert_close(ours.aux_loss, theirs[0])
        torch.testing.assert_close(combine_weights(ours), theirs[1])


# ---------------------------------------------------------------- dispatch
@pytest.mark.parametrize("k", [1, 2, 3])
def test_sparse_dispatch_and_combine_equal_the_dense_einsum_with_gradients(k):
    torch.manual_seed(k)
    tokens = torch.randn(24, 8, requires_grad=True)
    logits = torch.randn(24, 4, requires_grad=True)
    gating = {1: lambda: top1_gating(logits, 1.0, 2, use_rts=False),
              2: lambda: top2_gating(logits, 0.75, 2, second_expert_sampling=False),
              3: lambda: topk_gating(logits, 3, 0.5, 2)}[k]
    expert_fn = torch.randn(4, 8, 8)

    def run(sparse: bool):
        routing = gating()
        buffer = dispatch(tokens, routing) if sparse else einsum_dispatch(tokens, routing)
        out = torch.bmm(buffer, expert_fn)
        out = combine(out, routing) if sparse else einsum_combine(out, routing)
        out.pow(2).sum().backward()
        grads = tokens.grad.clone(), logits.grad.clone()
        tokens.grad = logits.grad = None
        return buffer.detach(), out.detach(), grads

    (b1, o1, g1), (b2, o2, g2) = run(True), run(False)
    assert int(gating().dropped) > 0 or k == 1  # capacity actually drops routes
    torch.testing.assert_close(b1, b2, rtol=0, atol=1e-6)
    torch.testing.assert_close(o1, o2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g1[0], g2[0], rtol=1e-5, atol=1e-6)
    # router gradients sum many terms that nearly cancel: compared relative to their scale
    torch.testing.assert_close(g1[1], g2[1], rtol=0, atol=1e-6 * float(g2[1].abs().max()) * 10)


# ---------------------------------------------------------------- the layer
@pytest.mark.parametrize("style", ["gpt2", "llama"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_layer_equals_a_per_token_loop_over_the_chosen_experts(style, k):
    torch.manual_seed(0)
    cfg = ModelConfig(style=style, n_layer=2, n_head=2, d_model=16, vocab_size=32, max_seq_len=16)
    layer = MoELayer(cfg, MoEConfig(num_experts=4, k=k, drop_tokens=False, top2_2nd_expert_sampling=False)).eval()
    x = torch.randn(2, 5, 16)
    y = layer(x)
    routing = layer.route(x.reshape(-1, 16))
    ex = layer.experts
    expected = torch.zeros(10, 16)
    for s, token in enumerate(x.reshape(-1, 16)):
        for j in range(k):
            e = int(routing.expert[s, j])
            if style == "llama":
                h = torch.nn.functional.silu(token @ ex.w_gate[e]) * (token @ ex.w_in[e])
                out = h @ ex.w_out[e]
            else:
                h = torch.nn.functional.gelu(token @ ex.w_in[e] + ex.b_in[e, 0], approximate="tanh")
                out = h @ ex.w_out[e] + ex.b_out[e, 0]
            expected[s] += routing.weight[s, j] * out
    torch.testing.assert_close(y.reshape(-1, 16), expected, rtol=1e-5, atol=1e-5)


def test_residual_moe_mixes_dense_mlp_and_experts_by_a_learned_coefficient():
    torch.manual_seed(0)
    layer = MoELayer(MODEL, MoEConfig(num_experts=2, k=1, use_residual=True, drop_tokens=False)).eval()
    x = torch.randn(1, 4, 16)
    tokens = x.reshape(-1, 16)
    routing = layer.route(tokens)
    moe_out = combine(layer.experts(dispatch(tokens, routing)), routing)
    coef = torch.softmax(layer.residual_coef(tokens), -1)
    expected = moe_out * coef[:, :1] + layer.residual_mlp(tokens) * coef[:, 1:]
    torch.testing.assert_close(layer(x).reshape(-1, 16), expected)


def test_noisy_gating_is_training_only_and_seeded():
    torch.manual_seed(0)
    layer = MoELayer(MODEL, MoEConfig(num_experts=4, k=1, noisy_gate_policy="jitter", drop_tokens=False))
    x = torch.randn(32, 16)
    torch.manual_seed(5)
    a = layer.route(x).weight
    torch.manual_seed(5)
    b = layer.route(x).weight
    torch.testing.assert_close(a, b)
    layer.eval()
    clean = torch.softmax(torch.nn.functional.linear(x, layer.gate.weight), 1).max(1).values
    torch.testing.assert_close(layer.route(x).weight[:, 0], clean)  # no noise at eval
    assert not torch.equal(a[:, 0], clean)


def test_moe_every_k_layers_or_chosen_layers():
    assert MoEConfig(num_experts=4, expert_interval=2).moe_layer_ids(6) == [1, 3, 5]
    assert MoEConfig(num_experts=4, layers=[0, 4]).moe_layer_ids(6) == [0, 4]
    model = GPT(ModelConfig(n_layer=4, n_head=2, d_model=16, vocab_size=32, max_seq_len=16),
                MoEConfig(num_experts=4, expert_interval=2))
    assert [isinstance(b.mlp, MoELayer) for b in model.blocks] == [False, True, False, True]
    dense = GPT(ModelConfig(n_layer=4, n_head=2, d_model=16, vocab_size=32, max_seq_len=16))
    assert model.num_active_params() < model.num_params()  # top-1 of 4 experts: a quarter of the expert weights
    assert model.num_active_params() == dense.num_params() + 2 * 16 * 4  # the two routers are all that is extra


def test_gpt_with_moe_trains_and_every_parameter_gets_a_gradient():
    torch.manual_seed(0)
    model = GPT(MODEL, MoEConfig(num_experts=4, k=2, use_residual=True, z_loss_coef=1e-3))
    ids = torch.randint(0, 32, (2, 16))
    out = model(ids, labels=ids)
    (out.loss + sum(m.aux_loss for m in moe_layers(model))).backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("overrides, message", [
    (dict(k=5), "moe.k=5 must be between 1 and moe.num_experts=4"),
    (dict(capacity_factor=0.0), "moe.capacity_factor=0.0 must be > 0"),
    (dict(eval_capacity_factor=-1.0), "moe.eval_capacity_factor=-1.0 must be > 0"),
    (dict(ep_size=3), "moe.num_experts=4 is not divisible by moe.ep_size=3"),
    (dict(noisy_gate_policy="gumbel"), "moe.noisy_gate_policy='gumbel' is not valid; choose one of: none, jitter, rsample"),
    (dict(noisy_gate_policy="rsample", k=2), "rsample applies to top-1 gating only"),
    (dict(layers=[0, 7]), "moe.layers=[0, 7] has [7] outside the model's blocks 0..1"),
    (dict(dispatch="cuda"), "moe.dispatch='cuda' is not valid"),
])
def test_bad_moe_config_names_the_key(overrides, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        validate_moe_config(MoEConfig(num_experts=4, **overrides), MODEL, world_size=12)


def test_dispatch_benchmark_compares_backends_side_by_side(tmp_path):
    from dsrecipes.benchmarks.moe import main

    rows = main(["--tokens", "64", "--experts", "4", "--d-model", "16", "--repeats", "1", "--out", str(tmp_path)])
    assert [r["dispatch"] for r in rows] == ["einsum", "torch"]
    assert rows[0]["speedup_vs_einsum"] == 1.0 and rows[1]["speedup_vs_einsum"] > 0
    assert (tmp_path / "moe_dispatch.csv").exists()


def test_moe_export_loads_for_inference_and_cached_generation_matches_recomputation(tmp_path):
    from dsrecipes.inference.loading import load_model
    from dsrecipes.models import export_safetensors

    torch.manual_seed(0)
    moe = MoEConfig(num_experts=4, k=2, drop_tokens=False)
    model = GPT(MODEL, moe).eval()
    export_safetensors(model.state_dict(), MODEL, tmp_path / "export", moe_cfg=moe)
    loaded, info = load_model(tmp_path / "export")
    assert info.moe_cfg is not None and isinstance(loaded.blocks[0].mlp, MoELayer)
    ids = torch.randint(0, 32, (1, 10))
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    # drop_tokens=false: each token's output is independent of the others, so the KV-cached decoder
    # (one token per step through the MoE layers) equals recomputing the whole sequence
    from dsrecipes.inference.decoder import CachedDecoder
    from dsrecipes.inference.generation import generate
    from tests.helpers.generation import no_cache_greedy

    prompt = ids[0].tolist()
    assert generate(CachedDecoder(loaded), [prompt], 6).tokens[0] == no_cache_greedy(loaded, prompt, 6)
