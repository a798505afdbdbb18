"""Direct Preference Optimisation (DPO) losses on per-sequence log-probabilities, in pure torch.

What: `sequence_logps` turns a causal LM's logits and dsrecipes' already-shifted labels into one summed log-probability
(and a token count) per sequence; `dpo_loss` turns the policy's and the frozen reference's log-probabilities of the
chosen and rejected completions of B preference pairs into the loss, the implicit rewards and their metrics.

Why here and not TRL: dsrecipes drives its own engine (DeepSpeed-style ZeRO, pipeline and accumulation runners), so
it needs the loss as a function of tensors it already has, not a Trainer. The definitions follow TRL 1.16's
`DPOTrainer` (the unit tests hold them against it) with h = (pi_c - pi_r) - (ref_c - ref_r):

* sigmoid: -logsigmoid(beta h) (1 - ls) - logsigmoid(-beta h) ls, the DPO paper's loss; ls > 0 is the conservative
  DPO (cDPO) label smoothing of older TRL. TRL 1.16's "sigmoid" has no smoothing (ls = 0 is the same loss);
* ipo: (h - 1 / (2 beta))^2 (IPO paper, Eq. 17). TRL averages each log-ratio over its completion tokens first: pass
  `chosen_token_counts` / `rejected_token_counts` (`sequence_logps`' counts) to get exactly that;
* hinge: relu(1 - beta h) (SLiC).

Rewards are beta (policy - reference) log-probabilities, detached, for logging; the reference is always detached.

Global-batch mean over gradient accumulation and data parallelism
-----------------------------------------------------------------
A step's global batch of P pairs is split over W data-parallel ranks x GAS accumulation micro-batches; micro-batch
(r, m) holds p_rm pairs (not necessarily equal). The loss the optimizer should see is the mean over all P pairs:

    L = (1 / P) sum_rm sum_(i in rm) loss_i = sum_rm dpo_loss(..., reduction="sum").loss / P

so every micro-batch backpropagates its *summed* loss divided by the *global* pair count P (known up front when all
micro-batches hold the same number of pairs, otherwise one all_reduce of the local counts before the first
backward). Averaging per-micro-batch means instead over-weights pairs in small micro-batches. Then undo what the
loop around it already divides by: dsrecipes' `Engine.backward` divides by GAS and its data-parallel strategies
average gradients over the W ranks, so through the Engine use

    engine.backward(out.loss * (GAS * W / P))            # or out.loss * W / P with scale_wrt_gas=False

and with plain autograd over summed (not averaged) gradients, `(out.loss / P).backward()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import torch
import torch.nn.functional as F

DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge")
REDUCTIONS = ("mean", "sum")

# logsumexp runs over row chunks of at most this many logits, so its float32 temporary stays bounded (256 MiB)
# instead of a second full [B, T, V] float copy
_LOGSUMEXP_CHUNK_ELEMENTS = 1 << 26


def sequence_logps(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence sum of the label tokens' log-probabilities and the number of label tokens.

    `labels` are already shifted (labels[b, t] is the target of position t, as in dsrecipes' batches); positions
    where labels == ignore_index (prompt, padding) count neither in the sum nor in the count. Computed in float32 (or
    the logits' dtype if wider): log p = logit[label] - logsumexp(logits), gathering the label logit first and
    taking logsumexp over row chunks, so no full log-softmax [B, T, V] is built beside the logits.

    Returns (sum_logps [B] float, token_counts [B] int64).
    """
    if logits.dim() != 3 or labels.dim() != 2 or logits.shape[:2] != labels.shape:
        raise ValueError(f"sequence_logps: logits must be [B, T, V] and labels [B, T]; got logits "
                         f"{tuple(logits.shape)} and labels {tuple(labels.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"sequence_logps: logits must be floating point, got {logits.dtype}")
    batch, length, vocab = logits.shape
    dtype = torch.promote_types(logits.dtype, torch.float32)
    mask = labels != ignore_index
    safe_labels = labels.masked_fill(~mask, 0)
    label_logits = logits.gather(-1, safe_labels.unsqueeze(-1)).squeeze(-1).to(dtype)
    rows = logits.reshape(-1, vocab)
    chunk_rows = max(1, _LOGSUMEXP_CHUNK_ELEMENTS // max(vocab, 1))
    # split (one backward node for all chunks), not slicing: slices would each allocate a full-size gradient
    lse = torch.cat([torch.logsumexp(chunk.to(dtype), dim=-1) for chunk in rows.split(chunk_rows)])
    token_logps = (label_logits - lse.view(batch, length)).masked_fill(~mask, 0.0)
    return token_logps.sum(dim=-1), mask.sum(dim=-1)


@dataclass
class DPOOutputs:
    """What `dpo_loss` returns. `loss` is reduced as asked (mean or sum over the pairs); the rest is per pair [B]."""

    loss: torch.Tensor
    losses: torch.Tensor  # per-pair loss [B], with gradient
    chosen_rewards: torch.Tensor  # beta * (policy - reference) chosen logps, detached
    rejected_rewards: torch.Tensor
    reward_margins: torch.Tensor  # chosen_rewards - rejected_rewards
    reward_accuracy: torch.Tensor  # 1.0 where chosen_reward > rejected_reward, else 0.0

    def metrics(self) -> dict[str, float]:
        """Means over this call's pairs ("dpo/loss" is the mean per-pair loss whatever the reduction)."""
        values = torch.stack([
            self.losses.detach().mean(),
            self.chosen_rewards.mean(),
            self.rejected_rewards.mean(),
            self.reward_margins.mean(),
            self.reward_accuracy.mean(),
        ]).tolist()  # one device sync for all five
        keys = ("dpo/loss", "dpo/rewards_chosen", "dpo/rewards_rejected", "dpo/reward_margin", "dpo/reward_accuracy")
        return dict(zip(keys, values))


def _check_options(beta: float, label_smoothing: float, loss_type: str, reduction: str) -> None:
    if isinstance(beta, bool) or not isinstance(beta, Real) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"dpo.beta must be a finite number > 0, got {beta!r}")
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"dpo.loss_type must be one of {list(DPO_LOSS_TYPES)}, got {loss_type!r}")
    if (isinstance(label_smoothing, bool) or not isinstance(label_smoothing, Real)
            or not 0.0 <= label_smoothing < 0.5):
        raise ValueError(f"dpo.label_smoothing must be a number in [0, 0.5), got {label_smoothing!r}")
    if label_smoothing != 0.0 and loss_type != "sigmoid":
        raise ValueError(f"dpo.label_smoothing={label_smoothing} applies only to dpo.loss_type='sigmoid', "
                         f"not {loss_type!r}: set it to 0")
    if reduction not in REDUCTIONS:
        raise ValueError(f"dpo_loss reduction must be one of {list(REDUCTIONS)}, got {reduction!r}")


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    loss_type: str = "sigmoid",
    *,
    reduction: str = "mean",
    chosen_token_counts: torch.Tensor | None = None,
    rejected_token_counts: torch.Tensor | None = None,
) -> DPOOutputs:
    """The DPO loss of B preference pairs from their per-sequence log-probabilities (all four [B]).

    reduction="mean" averages over the B pairs; "sum" adds them up, for a global-batch mean over accumulation
    micro-batches and ranks (divide by the global pair count: see the module docstring). chosen/rejected_token_counts
    ([B], used by loss_type="ipo" only) average each log-ratio over its completion tokens first, as TRL does.
    Computed in float32 (or wider); the reference log-probabilities are detached.
    """
    _check_options(beta, label_smoothing, loss_type, reduction)
    named = {"policy_chosen_logps": policy_chosen_logps, "policy_rejected_logps": policy_rejected_logps,
             "reference_chosen_logps": reference_chosen_logps, "reference_rejected_logps": reference_rejected_logps}
    shapes = {name: tuple(t.shape) for name, t in named.items()}
    if len(set(shapes.values())) != 1 or policy_chosen_logps.dim() != 1:
        raise ValueError(f"dpo_loss: the four log-prob tensors must all be [B] (one value per pair), got {shapes}")
    if (chosen_token_counts is None) != (rejected_token_counts is None):
        raise ValueError("dpo_loss: give both chosen_token_counts and rejected_token_counts, or neither")
    if chosen_token_counts is not None:
        counts = {"chosen_token_counts": tuple(chosen_token_counts.shape),
                  "rejected_token_counts": tuple(rejected_token_counts.shape)}
        if set(counts.values()) != {tuple(policy_chosen_logps.shape)}:
            raise ValueError(f"dpo_loss: token counts must be [B] like the log-probs {shapes['policy_chosen_logps']}, "
                             f"got {counts}")
    if reduction == "mean" and policy_chosen_logps.numel() == 0:
        raise ValueError("dpo_loss: reduction='mean' over zero pairs (use reduction='sum' for a rank without pairs)")

    dtype = torch.promote_types(policy_chosen_logps.dtype, torch.float32)
    chosen_logratios = policy_chosen_logps.to(dtype) - reference_chosen_logps.detach().to(dtype)
    rejected_logratios = policy_rejected_logps.to(dtype) - reference_rejected_logps.detach().to(dtype)

    if loss_type == "sigmoid":
        logits = beta * (chosen_logratios - rejected_logratios)
        losses = -F.logsigmoid(logits) * (1.0 - label_smoothing) - F.logsigmoid(-logits) * label_smoothing
    elif loss_type == "ipo":
        if chosen_token_counts is not None:
            h = (chosen_logratios / chosen_token_counts.to(dtype).clamp(min=1.0)
                 - rejected_logratios / rejected_token_counts.to(dtype).clamp(min=1.0))
        else:
            h = chosen_logratios - rejected_logratios
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    else:  # hinge
        losses = torch.relu(1.0 - beta * (chosen_logratios - rejected_logratios))

    chosen_rewards = beta * chosen_logratios.detach()
    rejected_rewards = beta * rejected_logratios.detach()
    return DPOOutputs(
        loss=losses.mean() if reduction == "mean" else losses.sum(),
        losses=losses,
        chosen_rewards=chosen_rewards,
        rejected_rewards=rejected_rewards,
        reward_margins=chosen_rewards - rejected_rewards,
        reward_accuracy=(chosen_rewards > rejected_rewards).to(dtype),
    )
