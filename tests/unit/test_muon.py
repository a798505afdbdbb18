"""optimizer=muon in one process: the Newton-Schulz iteration against an SVD, one Muon step against a restatement of
its formula, the Adam half against torch's AdamW, the split of the parameters by name and the bad input it refuses.

The distributed halves are elsewhere: DeepSpeed's Muon side by side at ZeRO 0-3 (tests/integration/
test_deepspeed_parity.py), ZeRO-3 and tensor parallelism against one process (the muon rows of the equivalence table).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from dsrecipes.models.gpt import GPT, ModelConfig
from dsrecipes.training.optim.muon import Muon, update_scale
from dsrecipes.training.optim.muon_params import muon_names, split_muon_groups
from dsrecipes.training.optim.newton_schulz import SINGULAR_VALUE_RANGE, orthogonalize
from dsrecipes.training.optim.optimizer_config import MuonConfig
from dsrecipes.training.optim.optimizers import build_optimizer, validate_optimizer_config

SHAPES = [(16, 16), (12, 40), (40, 12), (7, 33), (64, 8)]


def _matrix(shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).float()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("method", ["standard", "gram"])
def test_newton_schulz_gives_the_polar_factors_directions(shape, method):
    """G = U S V^T: the iteration's output is U S' V^T with the same U and V (U^T O V diagonal to 1e-4) and every
    singular value s' in SINGULAR_VALUE_RANGE (the quintic's coefficients trade convergence for speed)."""
    g = _matrix(shape)
    u, _, vh = torch.linalg.svd(g.double(), full_matrices=False)
    out = orthogonalize(g, 5, method).double()
    core = u.T @ out @ vh.T  # k x k, k = min(shape)
    off = core - torch.diag(torch.diagonal(core))
    assert off.abs().max() < 1e-4
    low, high = SINGULAR_VALUE_RANGE
    assert torch.diagonal(core).min() > low and torch.diagonal(core).max() < high
    # more steps than the coefficients are tuned for: still the same directions, values still bounded
    assert (u.T @ orthogonalize(g, 10, method).double() @ vh.T - torch.diag(torch.diagonal(core))).abs().max() < 0.5


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gram_and_standard_compute_the_same_polynomial(shape):
    g = _matrix(shape, seed=3)
    assert torch.allclose(orthogonalize(g, 5, "gram"), orthogonalize(g, 5, "standard"), atol=2e-5)


@pytest.mark.parametrize(("method", "dtype"), [("gram", torch.float32), ("gram", torch.float16), ("gram", torch.bfloat16),
                                               ("standard", torch.float32), ("standard", torch.bfloat16)], ids=str)
def test_newton_schulz_is_deepspeeds_op_for_op(method, dtype):
    """Bitwise DeepSpeed 0.19.8's zeropower_via_gram_newtonschulz / zeropower_via_newtonschulz5 (run eagerly, their
    compute dtype forced to `dtype`) on wide, tall, square and batched matrices: in fp16 / bf16 an iteration in
    another order of operations differs by up to 0.1 (measured), which training turns into loss differences.
    Not standard in fp16, a dtype DeepSpeed never runs it in: dsrecipes takes the norm before that cast (fp16's
    range), DeepSpeed's function after it."""
    original_muon = pytest.importorskip("deepspeed.runtime.zero.muon.original_muon")
    theirs = (original_muon.zeropower_via_gram_newtonschulz if method == "gram"
              else original_muon.zeropower_via_newtonschulz5)
    with torch._dynamo.config.patch(disable=True), pytest.MonkeyPatch.context() as patch:
        patch.setattr(original_muon, "ns_compute_dtype", lambda _method: dtype)
        for shape in [(8, 6), (3, 8), (8, 8), (64, 32), (2, 12, 5)]:
            g = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))
            assert torch.equal(orthogonalize(g, 5, method, dtype), theirs(g.clone(), steps=5)), shape


def test_newton_schulz_refuses_what_is_not_a_matrix():
    with pytest.raises(ValueError, match="shape"):
        orthogonalize(torch.ones(4), 5)
    with pytest.raises(ValueError, match="method 'cubic'"):
        orthogonalize(torch.ones(4, 4), 5, "cubic")


def _restated_muon_step(weight, grad, momentum, *, lr, beta, decay, nesterov, rule):
    """One Muon step written out from the formula (the test's own statement, not the optimizer's code path)."""
    momentum = beta * momentum + (1 - beta) * grad
    blended = (1 - beta) * grad + beta * momentum if nesterov else momentum
    rows, cols = weight.shape
    scale = max(1.0, rows / cols) ** 0.5 if rule == "shape_ratio" else 0.2 * max(rows, cols) ** 0.5
    return weight * (1 - lr * decay) - lr * scale * orthogonalize(blended, 5, "standard"), momentum


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("rule", ["shape_ratio", "match_adamw_rms"])
def test_muon_steps_are_the_formula(nesterov, rule):
    weight = torch.nn.Parameter(_matrix((24, 10)))
    optimizer = Muon([{"params": [weight], "use_muon": True}], lr=0.05, momentum=0.9, nesterov=nesterov,
                     ns_method="standard", update_scale=rule, weight_decay=0.1)
    expected, momentum = weight.detach().clone(), torch.zeros(24, 10)
    for step in range(3):
        weight.grad = _matrix((24, 10), seed=10 + step)
        expected, momentum = _restated_muon_step(expected, weight.grad, momentum, lr=0.05, beta=0.9, decay=0.1,
                                                 nesterov=nesterov, rule=rule)
        optimizer.step()
        assert torch.allclose(weight.detach(), expected, atol=1e-6)
    assert torch.allclose(optimizer.state[weight]["momentum_buffer"], momentum, atol=1e-7)


def test_match_adamw_rms_gives_the_update_adamws_rms():
    """Moonlight's rule: the scaled update's RMS is about rms_target (0.2) whatever the shape."""
    for rows, cols in [(64, 16), (16, 64), (32, 32)]:
        update = orthogonalize(_matrix((rows, cols), seed=rows)) * update_scale(rows, cols, "match_adamw_rms", 0.2)
        assert 0.12 < update.pow(2).mean().sqrt().item() < 0.25


def test_adam_half_is_adamw():
    """Parameters of a use_muon=false group take decoupled-weight-decay Adam: torch's AdamW to fp32 rounding."""
    ours, theirs = torch.nn.Parameter(_matrix((5, 3))), torch.nn.Parameter(_matrix((5, 3)))
    muon = Muon([{"params": [ours], "use_muon": False}], lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    adamw = torch.optim.AdamW([theirs], lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    for step in range(5):
        ours.grad = theirs.grad = _matrix((5, 3), seed=step)
        muon.step()
        adamw.step()
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert float(muon.state[ours]["step"]) == 5.0


def _gpt():
    return GPT(ModelConfig(n_layer=2, n_head=2, d_model=32, vocab_size=64, max_seq_len=16))


def test_default_split_sends_embeddings_norms_and_biases_to_adam():
    cfg = MuonConfig()
    model = _gpt()
    named = list(model.named_parameters())
    chosen = muon_names(named, cfg.muon_params, cfg.adam_params)
    assert chosen == {n for n, p in named if p.ndim == 2 and "emb" not in n}
    assert "blocks.0.attn.q_proj.weight" in chosen and "tok_emb.weight" not in chosen
    optimizer = build_optimizer(cfg, model)
    kinds = {(g["use_muon"], g["weight_decay"]): sum(p.numel() for p in g["params"]) for g in optimizer.param_groups}
    assert set(kinds) == {(True, 0.1), (False, 0.1), (False, 0.0)}  # matrices; embeddings; biases and norms
    assert kinds[True, 0.1] == sum(p.numel() for n, p in named if n in chosen)


def test_adam_lr_sets_the_adam_halfs_lr_unless_a_group_has_its_own():
    model = _gpt()
    groups = [{"params": list(model.blocks.parameters()), "weight_decay": 0.0},
              {"params": [model.tok_emb.weight], "lr": 0.5, "weight_decay": 0.0}]
    split = split_muon_groups(model, groups, ["all-matrices"], ["tok_emb"], adam_lr=3e-4)
    assert [(g["use_muon"], g.get("lr")) for g in split] == [(True, None), (False, 3e-4), (False, 0.5)]


def test_a_muon_pattern_that_selects_nothing_is_refused_by_name():
    named = list(_gpt().named_parameters())
    with pytest.raises(ValueError, match=r"optimizer.muon_params entry 'mlp.fc_gate' selects no trainable matrix"):
        muon_names(named, ["mlp.fc_gate"], [])
    with pytest.raises(ValueError, match=r"leaves Muon no parameter.*optimizer.adam_params"):
        muon_names(named, ["all-matrices"], ["re:.*"])
    with pytest.raises(ValueError, match=r"optimizer.adam_params entry 're:\(' is not a valid regex"):
        muon_names(named, ["all-matrices"], ["re:("])


def test_muon_config_values_are_checked():
    validate_optimizer_config(MuonConfig())
    with pytest.raises(ValueError, match="optimizer.momentum"):
        validate_optimizer_config(MuonConfig(momentum=-0.5))
    with pytest.raises(ValueError, match="ns_dtype='float8'"):
        Muon([torch.nn.Parameter(torch.ones(2, 2))], ns_dtype="float8")


def test_a_vector_in_a_muon_group_is_refused():
    vector = torch.nn.Parameter(torch.ones(3))
    vector.grad = torch.ones(3)
    with pytest.raises(ValueError, match=r"shape \(3,\) is in a use_muon group"):
        Muon([{"params": [vector], "use_muon": True}]).step()


def test_muon_trains_the_gpt_and_its_state_round_trips():
    """A few steps on a fixed batch lower the loss; state_dict / load_state_dict continue bit for bit."""
    torch.manual_seed(0)
    model = _gpt()
    tokens = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(1))

    def step(model, optimizer):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        return loss.item()

    optimizer = build_optimizer(MuonConfig(lr=0.02), model)
    losses = [step(model, optimizer) for _ in range(6)]
    assert losses[-1] < losses[0] - 0.3
    twin = _gpt()
    twin.load_state_dict(model.state_dict())
    twin_optimizer = build_optimizer(MuonConfig(lr=0.02), twin)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # a copy: torch shares same-device tensors
    assert [step(model, optimizer) for _ in range(2)] == [step(twin, twin_optimizer) for _ in range(2)]
    assert not math.isnan(losses[-1])


def test_a_stack_of_expert_matrices_is_orthogonalised_matrix_by_matrix():
    stack = torch.stack([_matrix((12, 20), seed=s) for s in range(3)])
    together = orthogonalize(stack, 5, "gram")
    for i in range(3):
        assert torch.allclose(together[i], orthogonalize(stack[i], 5, "gram"), atol=1e-6)
