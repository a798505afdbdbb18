"""dsrecipes.training.preference.losses: per-sequence log-probs, the DPO / IPO / hinge losses, their reduction.

What is checked and against what:
* `sequence_logps` against a plain loop over positions (log_softmax of one position at a time, float64);
* `dpo_loss` against the closed-form formulas written out here with `math`, and against TRL 1.16's own loss code:
  TRL 1.16 has no standalone DPO loss function; the loss lives inside `DPOTrainer._compute_loss(model, inputs,
  return_outputs)`, which also runs the model. The oracle builds a bare `object.__new__(DPOTrainer)` with only the
  attributes that method reads, a stub model that returns fixed per-token log-probs, and precomputed reference
  log-probs (see `_trl_dpo`). No network, no model weights;
* `reduction="sum"` / global pair count == the mean over the whole global batch, however it is chunked.

trl is imported by the oracle fixture only (dsrecipes never imports it).
"""

from __future__ import annotations

import importlib
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from dsrecipes.training.preference import dpo_loss, sequence_logps

# the module itself (its private helpers), beside the functions the package exports
dpo_module = importlib.import_module("dsrecipes.training.preference.losses")

F64 = torch.float64


# ---------------------------------------------------------------- sequence_logps


def _loop_logps(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> tuple[list, list]:
    sums, counts = [], []
    for b in range(labels.shape[0]):
        total, count = 0.0, 0
        for t in range(labels.shape[1]):
            label = int(labels[b, t])
            if label == ignore_index:
                continue
            total += float(torch.log_softmax(logits[b, t].double(), dim=-1)[label])
            count += 1
        sums.append(total)
        counts.append(count)
    return sums, counts


def _batch(seed: int = 0, batch: int = 4, length: int = 9, vocab: int = 13, ignore_index: int = -100):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, vocab, generator=gen, dtype=F64) * 3
    labels = torch.randint(0, vocab, (batch, length), generator=gen)
    labels[0, :4] = ignore_index  # a prompt
    labels[1, ::2] = ignore_index  # holes
    labels[2, :] = ignore_index  # nothing to score
    return logits, labels


@pytest.mark.parametrize("ignore_index", [-100, 0])
def test_sequence_logps_matches_a_loop_over_positions(ignore_index):
    logits, labels = _batch(ignore_index=-100)
    if ignore_index == 0:  # a real token id as the ignore index: label 0 must then be skipped, not scored
        labels = labels.masked_fill(labels == -100, 0)
    sums, counts = sequence_logps(logits, labels, ignore_index=ignore_index)
    want_sums, want_counts = _loop_logps(logits, labels, ignore_index)
    assert counts.dtype == torch.int64 and counts.tolist() == want_counts
    assert torch.allclose(sums, torch.tensor(want_sums, dtype=F64), rtol=0, atol=1e-6)
    if ignore_index == -100:
        assert want_counts[2] == 0 and sums[2].item() == 0.0
        assert want_counts[0] == 9 - 4 and want_counts[1] == 4


def test_sequence_logps_float32_and_bf16_compute_in_float32():
    logits, labels = _batch(seed=1)
    want, _ = _loop_logps(logits, labels)
    got32, _ = sequence_logps(logits.float(), labels)
    assert got32.dtype == torch.float32
    assert torch.allclose(got32.double(), torch.tensor(want, dtype=F64), rtol=1e-6, atol=1e-6)
    low = logits.bfloat16()
    got16, _ = sequence_logps(low, labels)
    want16, _ = _loop_logps(low.double(), labels)  # the same bf16 values, scored exactly
    assert got16.dtype == torch.float32
    assert torch.allclose(got16.double(), torch.tensor(want16, dtype=F64), rtol=1e-6, atol=1e-6)


def test_sequence_logps_chunked_logsumexp_values_and_gradients(monkeypatch):
    logits, labels = _batch(seed=2)
    reference = logits.clone().requires_grad_()
    per_token = torch.log_softmax(reference, dim=-1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    ((per_token * (labels != -100)).sum(dim=-1) * torch.arange(1.0, 5.0, dtype=F64)).sum().backward()
    monkeypatch.setattr(dpo_module, "_LOGSUMEXP_CHUNK_ELEMENTS", 13 * 5)  # 5 rows a chunk: 36 rows, 8 chunks
    ours = logits.clone().requires_grad_()
    sums, _ = sequence_logps(ours, labels)
    (sums * torch.arange(1.0, 5.0, dtype=F64)).sum().backward()
    assert torch.allclose(ours.grad, reference.grad, rtol=0, atol=1e-12)
    assert torch.allclose(sums, torch.tensor(_loop_logps(logits, labels)[0], dtype=F64), rtol=0, atol=1e-6)


def test_sequence_logps_rejects_bad_shapes():
    with pytest.raises(ValueError, match="labels"):
        sequence_logps(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="floating"):
        sequence_logps(torch.zeros(2, 3, 5, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))


# ---------------------------------------------------------------- dpo_loss: closed forms

# six pairs: policy chosen/rejected, reference chosen/rejected; pairs 2 and 3 reward the rejected more, 4 is a tie
PC = [-12.5, -8.0, -20.25, -5.0, -7.0, -3.5]
PR = [-14.0, -9.5, -19.0, -4.0, -7.5, -9.0]
RC = [-13.0, -8.5, -20.0, -5.5, -7.25, -4.0]
RR = [-13.5, -9.0, -21.0, -5.0, -7.75, -6.0]
NC = [5, 3, 9, 2, 4, 1]  # completion token counts, for TRL's per-token IPO
NR = [6, 4, 7, 2, 3, 8]


def _tensors(dtype=F64):
    return [torch.tensor(v, dtype=dtype) for v in (PC, PR, RC, RR)]


def _logsigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _hand_losses(loss_type: str, beta: float, ls: float = 0.0, per_token: bool = False) -> list[float]:
    out = []
    for pc, pr, rc, rr, nc, nr in zip(PC, PR, RC, RR, NC, NR):
        if loss_type == "sigmoid":
            h = (pc - pr) - (rc - rr)
            out.append(-_logsigmoid(beta * h) * (1 - ls) - _logsigmoid(-beta * h) * ls)
        elif loss_type == "ipo":
            h = (pc - rc) / nc - (pr - rr) / nr if per_token else (pc - pr) - (rc - rr)
            out.append((h - 1 / (2 * beta)) ** 2)
        else:
            out.append(max(0.0, 1 - beta * ((pc - pr) - (rc - rr))))
    return out


@pytest.mark.parametrize(("loss_type", "beta", "ls"), [
    ("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.2), ("sigmoid", 2.0, 0.45), ("ipo", 0.1, 0.0), ("ipo", 0.7, 0.0),
    ("hinge", 0.1, 0.0), ("hinge", 1.5, 0.0)])
def test_dpo_loss_matches_the_closed_form(loss_type, beta, ls):
    out = dpo_loss(*_tensors(), beta=beta, label_smoothing=ls, loss_type=loss_type)
    want = _hand_losses(loss_type, beta, ls)
    assert torch.allclose(out.losses, torch.tensor(want, dtype=F64), rtol=0, atol=1e-6)
    assert abs(out.loss.item() - sum(want) / len(want)) <= 1e-6
    chosen = [beta * (p - r) for p, r in zip(PC, RC)]
    rejected = [beta * (p - r) for p, r in zip(PR, RR)]
    assert torch.allclose(out.chosen_rewards, torch.tensor(chosen, dtype=F64), rtol=0, atol=1e-6)
    assert torch.allclose(out.rejected_rewards, torch.tensor(rejected, dtype=F64), rtol=0, atol=1e-6)
    margins = [c - r for c, r in zip(chosen, rejected)]
    assert torch.allclose(out.reward_margins, torch.tensor(margins, dtype=F64), rtol=0, atol=1e-6)
    assert out.reward_accuracy.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]  # a tie (pair 4) is not won
    metrics = out.metrics()
    assert set(metrics) == {"dpo/loss", "dpo/rewards_chosen", "dpo/rewards_rejected", "dpo/reward_margin",
                            "dpo/reward_accuracy"}
    assert all(isinstance(v, float) for v in metrics.values())
    assert abs(metrics["dpo/loss"] - sum(want) / 6) <= 1e-6 and metrics["dpo/reward_accuracy"] == 3 / 6
    assert abs(metrics["dpo/reward_margin"] - sum(margins) / 6) <= 1e-6


def test_ipo_with_token_counts_is_the_per_token_form():
    counts = [torch.tensor(v) for v in (NC, NR)]
    out = dpo_loss(*_tensors(), beta=0.3, loss_type="ipo", chosen_token_counts=counts[0],
                   rejected_token_counts=counts[1])
    assert torch.allclose(out.losses, torch.tensor(_hand_losses("ipo", 0.3, per_token=True), dtype=F64), atol=1e-6)
    assert torch.allclose(out.chosen_rewards, 0.3 * (_tensors()[0] - _tensors()[2]), atol=1e-6)  # rewards: unscaled


def test_reference_is_detached_and_policy_gradient_is_the_closed_form():
    pc, pr, rc, rr = (t.clone().requires_grad_() for t in _tensors())
    beta = 0.2
    dpo_loss(pc, pr, rc, rr, beta=beta).loss.backward()
    assert rc.grad is None and rr.grad is None
    h = [(a - b) - (c - d) for a, b, c, d in zip(PC, PR, RC, RR)]
    want = [-beta / (1 + math.exp(beta * x)) / len(h) for x in h]  # d/dpc of mean(-logsigmoid(beta h))
    assert torch.allclose(pc.grad, torch.tensor(want, dtype=F64), atol=1e-9)
    assert torch.allclose(pr.grad, -pc.grad, atol=1e-12)


def test_low_precision_inputs_are_computed_in_float32():
    out = dpo_loss(*_tensors(torch.bfloat16))
    assert out.loss.dtype == torch.float32 and out.chosen_rewards.dtype == torch.float32


# ---------------------------------------------------------------- the oracle: TRL 1.16's DPOTrainer loss


class _StubModel:
    """Stands in for the policy in `_compute_loss`: returns the fixed per-token log-probs (what TRL's fused LM head
    gives, 0 at label -100), plus the logging-only fields the method reads (entropy, mean_logits, is_top1)."""

    training = True

    def __init__(self, per_token_logps: torch.Tensor):
        self.per_token_logps = per_token_logps

    def __call__(self, *, labels, fused_lm_head, **kwargs):
        assert fused_lm_head and labels.shape[1] == self.per_token_logps.shape[1] + 1
        zeros = torch.zeros_like(self.per_token_logps)
        return SimpleNamespace(log_probs=self.per_token_logps, entropy=zeros, mean_logits=zeros,
                               is_top1=torch.zeros_like(zeros, dtype=torch.bool))


@pytest.fixture(scope="module")
def trl_dpo():
    """`_trl_dpo(loss_type, beta, ls, pairs)` -> (loss, rewards/chosen mean, rewards/rejected mean) from TRL 1.16's
    `DPOTrainer._compute_loss`, on a trainer made by `object.__new__` with exactly the attributes that method reads:
    beta, label_smoothing, loss_types=[loss_type], loss_weights=[1.0], f_divergence_type="reverse_kl" (standard
    DPO), ld_alpha=None (no LD-DPO length weighting), use_weighting=False (no WPO), aux_loss_enabled=False (no MoE),
    precompute_ref_logps=True (the reference log-probs come from the inputs: no reference model), model (the stub),
    accelerator (cpu; gather / gather_for_metrics = identity, one process), and the metric stores _metrics,
    _total_train_tokens, _tp_size."""
    trl = pytest.importorskip("trl")
    if trl.__version__.split(".")[:2] != ["1", "16"]:
        pytest.skip(f"the oracle is written against TRL 1.16's DPOTrainer._compute_loss, found trl {trl.__version__}")
    from trl.trainer.dpo_trainer import DPOTrainer

    def run(loss_type: str, beta: float, ls: float, pairs: list[int]):
        # per-token log-probs whose completion sums are PC / PR; prompt 2 tokens, then NC / NR completion tokens
        length = 2 + max(NC + NR)
        rows = [(PC[i], NC[i]) for i in pairs] + [(PR[i], NR[i]) for i in pairs]  # batch is [chosen, rejected]
        completion_mask = torch.zeros(len(rows), length, dtype=torch.long)
        per_token = torch.zeros(len(rows), length - 1, dtype=F64)
        for row, (total, count) in enumerate(rows):
            completion_mask[row, 2:2 + count] = 1
            weights = torch.arange(1, count + 1, dtype=F64)
            per_token[row, 1:1 + count] = total * weights / weights.sum()  # shifted: position t scores token t+1
        trainer = object.__new__(DPOTrainer)
        for name, value in dict(
            beta=beta, label_smoothing=ls, loss_types=[loss_type], loss_weights=[1.0],
            f_divergence_type="reverse_kl", ld_alpha=None, use_weighting=False, aux_loss_enabled=False,
            precompute_ref_logps=True, model=_StubModel(per_token),
            accelerator=SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t, gather_for_metrics=lambda t: t),
            _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
        ).items():
            setattr(trainer, name, value)
        inputs = {"input_ids": torch.ones(len(rows), length, dtype=torch.long),
                  "attention_mask": torch.ones(len(rows), length, dtype=torch.long),
                  "completion_mask": completion_mask,
                  "ref_chosen_logps": torch.tensor([RC[i] for i in pairs], dtype=F64),
                  "ref_rejected_logps": torch.tensor([RR[i] for i in pairs], dtype=F64)}
        loss = trainer._compute_loss(trainer.model, inputs, return_outputs=False)
        metrics = trainer._metrics["train"]
        return loss.item(), metrics["rewards/chosen"][0], metrics["rewards/rejected"][0], metrics

    return run


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "hinge"])
@pytest.mark.parametrize("beta", [0.1, 0.6])
def test_dpo_loss_matches_trl(trl_dpo, loss_type, beta):
    counts = {"chosen_token_counts": torch.tensor(NC), "rejected_token_counts": torch.tensor(NR)}
    out = dpo_loss(*_tensors(), beta=beta, loss_type=loss_type, **counts)  # counts: used by ipo only
    loss, chosen, rejected, metrics = trl_dpo(loss_type, beta, 0.0, list(range(6)))
    assert abs(out.loss.item() - loss) <= 1e-6
    ours = out.metrics()
    assert abs(ours["dpo/rewards_chosen"] - chosen) <= 1e-6 and abs(ours["dpo/rewards_rejected"] - rejected) <= 1e-6
    assert abs(ours["dpo/reward_margin"] - metrics["rewards/margins"][0]) <= 1e-6
    assert ours["dpo/reward_accuracy"] == metrics["rewards/accuracies"][0]
    for i in range(6):  # per pair: TRL only logs batch means, so one pair per call
        loss, chosen, rejected, _ = trl_dpo(loss_type, beta, 0.0, [i])
        assert abs(out.losses[i].item() - loss) <= 1e-6
        assert abs(out.chosen_rewards[i].item() - chosen) <= 1e-6
        assert abs(out.rejected_rewards[i].item() - rejected) <= 1e-6


@pytest.mark.parametrize("ls", [0.1, 0.3])
def test_label_smoothed_sigmoid_against_trl(trl_dpo, ls):
    """TRL 1.16's "sigmoid" ignores label_smoothing (checked here, so a TRL that changes it is noticed). Its
    smoothed form, -logsigmoid(beta d)(1 - ls) - logsigmoid(-beta d) ls, is the "aot" loss's, where d is h after
    sorting the batch's log-ratios: with one pair per call the sort is the identity and d == h, the cDPO loss."""
    beta = 0.4
    out = dpo_loss(*_tensors(), beta=beta, label_smoothing=ls)
    plain = dpo_loss(*_tensors(), beta=beta)
    assert abs(trl_dpo("sigmoid", beta, ls, list(range(6)))[0] - plain.loss.item()) <= 1e-6
    for i in range(6):
        assert abs(trl_dpo("aot", beta, ls, [i])[0] - out.losses[i].item()) <= 1e-6


# ---------------------------------------------------------------- reduction over a split global batch


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "hinge"])
def test_sum_reduction_over_chunks_is_the_global_mean(loss_type):
    gen = torch.Generator().manual_seed(3)
    logps = [-10 * torch.rand(8, generator=gen, dtype=F64) for _ in range(4)]
    kwargs = dict(beta=0.25, label_smoothing=0.1 if loss_type == "sigmoid" else 0.0, loss_type=loss_type)
    full = [t.clone().requires_grad_() for t in logps[:2]]
    whole = dpo_loss(*full, *logps[2:], **kwargs).loss
    whole.backward()
    parts = [t.clone().requires_grad_() for t in logps[:2]]
    bounds = [(0, 1), (1, 3), (3, 5), (5, 8)]  # 4 uneven micro-batches (1, 2, 2, 3 pairs), e.g. 2 ranks x 2 steps
    total = sum(dpo_loss(*(t[a:b] for t in parts), *(t[a:b] for t in logps[2:]), reduction="sum", **kwargs).loss
                for a, b in bounds) / 8
    total.backward()
    assert abs(total.item() - whole.item()) <= 1e-7
    assert all(torch.allclose(p.grad, f.grad, rtol=0, atol=1e-7) for p, f in zip(parts, full))
    mean_of_means = sum(dpo_loss(*(t[a:b] for t in logps), **kwargs).loss for a, b in bounds) / 4
    assert abs(mean_of_means.item() - whole.item()) > 1e-4  # the naive average of micro-batch means is not it


def test_sum_reduction_allows_an_empty_rank():
    empty = [torch.zeros(0, dtype=F64) for _ in range(4)]
    assert dpo_loss(*empty, reduction="sum").loss.item() == 0.0
    with pytest.raises(ValueError, match="zero pairs"):
        dpo_loss(*empty)


# ---------------------------------------------------------------- bad values


@pytest.mark.parametrize(("kwargs", "key"), [
    (dict(beta=0.0), "dpo.beta"), (dict(beta=-0.1), "dpo.beta"), (dict(beta=float("nan")), "dpo.beta"),
    (dict(beta=float("inf")), "dpo.beta"), (dict(beta=True), "dpo.beta"), (dict(beta="0.1"), "dpo.beta"),
    (dict(label_smoothing=-0.1), "dpo.label_smoothing"), (dict(label_smoothing=0.5), "dpo.label_smoothing"),
    (dict(label_smoothing=1.0), "dpo.label_smoothing"), (dict(label_smoothing=None), "dpo.label_smoothing"),
    (dict(loss_type="ipo", label_smoothing=0.1), "dpo.label_smoothing"),
    (dict(loss_type="robust"), "dpo.loss_type"), (dict(loss_type="SIGMOID"), "dpo.loss_type"),
    (dict(reduction="none"), "reduction"),
])
def test_bad_values_raise_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        dpo_loss(*_tensors(), **kwargs)


def test_shape_mismatches_raise():
    pc, pr, rc, rr = _tensors()
    with pytest.raises(ValueError, match="reference_rejected_logps"):
        dpo_loss(pc, pr, rc, rr[:-1])
    with pytest.raises(ValueError, match=r"\[B\]"):
        dpo_loss(*(t.view(2, 3) for t in (pc, pr, rc, rr)))
    with pytest.raises(ValueError, match="token counts"):
        dpo_loss(pc, pr, rc, rr, loss_type="ipo", chosen_token_counts=torch.ones(5),
                 rejected_token_counts=torch.ones(6))
    with pytest.raises(ValueError, match="both"):
        dpo_loss(pc, pr, rc, rr, loss_type="ipo", chosen_token_counts=torch.ones(6))
