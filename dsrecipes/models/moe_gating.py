"""MoE gating: which expert(s) each token goes to, at which slot, with which weight (DeepSpeed semantics).

Everything runs in fp32 on router logits [S tokens, E experts] and returns a sparse `Routing`
(k routes per token: expert id, slot in that expert's capacity buffer, combine weight) instead of
DeepSpeed's dense [S, E, C] one-hot tensors, so memory stays O(S*k) plus O(S*E) for the softmax.

Semantics (deepspeed/moe/sharded_moe.py):
* capacity C = max(ceil(S / E * capacity_factor * k'), min_capacity) with k' = 1 for top-1, 2 for
  top-2 and k for top-k; with drop_tokens=False C is the busiest expert's load (max over the
  expert-parallel group) and nothing is dropped.
* top-1: expert = argmax of the softmax (of logits + Gumbel noise under RSample); aux loss
  sum_e(mean_s gates[:, e] * mean_s mask[:, e]) * E; over capacity, random token selection (use_rts)
  keeps tokens by uniform random priority; without it, each expert keeps the tokens that
  `torch.topk(one_hot(expert), k=min(C, S), dim=0)` returns for its column (DeepSpeed's call, made
  here too): every candidate ties at 1, so the survivors follow torch.topk's tie order on that
  device, not token order (on CPU, 16 tokens all choosing one expert with C = 2 keep tokens 10 and
  11). The kept token's weight is its softmax probability (not renormalised).
* top-2: second expert = argmax of the logits (plus Gumbel noise when sampling) with the first masked;
  aux loss mean_e(me * ce) * E^2 using first choices; first choices take slots before second
  choices; the surviving weights are renormalised g_i / (g_1 + g_2).
* top-k (k > 2): the k largest probabilities; aux loss mean(me * ce) * E^2 / k; over capacity keep the
  tokens with the largest gate ("probs") or the first ones ("position"); weights renormalised over the
  surviving routes.
* slots inside an expert's buffer follow token order among the kept routes (top-2: first choices
  first), as DeepSpeed's cumsum locations do.
* router z-loss (ST-MoE): mean_s(logsumexp(logits)^2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MaxReduce = Callable[[torch.Tensor], torch.Tensor] | None


@dataclass
class Routing:
    """k routes per token. expert[s, j] = -1 marks a dropped route (weight 0, slot meaningless)."""

    expert: torch.Tensor  # [S, k] int64
    slot: torch.Tensor  # [S, k] int64, position in the expert's capacity buffer
    weight: torch.Tensor  # [S, k] fp32 combine weights (differentiable w.r.t. the router)
    capacity: int
    num_experts: int
    aux_loss: torch.Tensor  # scalar, load-balancing loss (before the trainer's coefficient)
    z_loss: torch.Tensor  # scalar router z-loss
    expert_counts: torch.Tensor  # [E] routes assigned to each expert before capacity dropping
    dropped: torch.Tensor  # scalar int64: routes dropped by the capacity limit

    @property
    def kept(self) -> torch.Tensor:
        return self.expert >= 0

    def flat_slots(self) -> torch.Tensor:
        """[S, k] index into the flattened [E * C] buffer; dropped routes point at the scratch row E * C."""
        scratch = torch.full_like(self.slot, self.num_experts * self.capacity)
        return torch.where(self.kept, self.expert * self.capacity + self.slot, scratch)


def capacity_for(num_tokens: int, num_experts: int, capacity_factor: float, min_capacity: int) -> int:
    """C = max(ceil(num_tokens / num_experts * capacity_factor), min_capacity)."""
    return max(int(math.ceil(num_tokens / num_experts * capacity_factor)), int(min_capacity))


def rank_within_expert(expert: torch.Tensor, visit_order: torch.Tensor, num_bins: int) -> torch.Tensor:
    """For routes visited in `visit_order`, how many earlier-visited routes chose the same expert.

    expert: [R] ids in [0, num_bins); visit_order: a permutation of range(R). O(R log R), no [R, E].
    """
    visited = expert[visit_order]
    sorted_expert, perm = torch.sort(visited, stable=True)
    counts = torch.bincount(sorted_expert, minlength=num_bins)
    starts = torch.cumsum(counts, 0) - counts
    rank_sorted = torch.arange(expert.numel(), device=expert.device) - starts[sorted_expert]
    rank_visited = torch.empty_like(rank_sorted).scatter_(0, perm, rank_sorted)
    return torch.empty_like(rank_visited).scatter_(0, visit_order, rank_visited)


def _token_order_slots(expert: torch.Tensor, kept: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Slots numbering each expert's kept routes 0, 1, ... in token-major order ([S, k] in, [S, k] out)."""
    flat = torch.where(kept, expert, torch.full_like(expert, num_experts)).reshape(-1)
    order = torch.arange(flat.numel(), device=flat.device)
    return rank_within_expert(flat, order, num_experts + 1).view_as(expert)


def _resolve_capacity(counts: torch.Tensor, capacity: int, drop_tokens: bool, max_reduce: MaxReduce) -> int:
    if drop_tokens:
        return capacity
    busiest = counts.max().reshape(1)
    if max_reduce is not None:  # every expert-parallel rank must use the same buffer size
        busiest = max_reduce(busiest)
    return max(int(busiest.item()), 1)


def _balance_terms(logits: torch.Tensor, gates: torch.Tensor, first_choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(me * ce per expert, z-loss): mean gate probability times fraction of first choices."""
    num_experts = gates.shape[1]
    me = gates.mean(0)
    ce = torch.bincount(first_choice.reshape(-1), minlength=num_experts).float() / first_choice.numel()
    z_loss = torch.logsumexp(logits, dim=-1).pow(2).mean()
    return me * ce, z_loss


def gumbel_like(x: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise of x's shape (from torch's global RNG)."""
    uniform = torch.rand_like(x).clamp_(min=1e-20, max=1.0 - 1e-7)
    return -torch.log(-torch.log(uniform))


def top1_kept_without_rts(expert: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """[S] bool: which top-1 routes survive the capacity limit without random token selection.

    DeepSpeed (top1gating, use_rts=False) keeps, per expert, the rows `torch.topk` picks from the int64
    one-hot mask along the token dimension. All candidates tie at 1, so the survivors are whatever
    torch.topk's tie order yields, which no closed-form rule (first-come, last-come) reproduces;
    making the same call on the same [S, E] int64 tensor is the only way to keep the same tokens on
    every device. Costs O(S * E), like the softmax.
    """
    mask = F.one_hot(expert, num_experts)
    k = min(int(capacity), expert.numel())  # topk cannot select more rows than there are tokens
    chosen = torch.topk(mask, k=k, dim=0).indices  # [k, E]; may include non-candidates (zeros)
    selected = torch.zeros_like(mask).scatter_(0, chosen, 1)
    return selected.gather(1, expert.unsqueeze(1)).squeeze(1).bool()


def top1_gating(
    logits: torch.Tensor,
    capacity_factor: float,
    min_capacity: int,
    drop_tokens: bool = True,
    use_rts: bool = True,
    rsample: bool = False,
    max_reduce: MaxReduce = None,
) -> Routing:
    """DeepSpeed's top1gating as a sparse Routing (rsample: noisy_gate_policy=RSample)."""
    num_tokens, num_experts = logits.shape
    gates = F.softmax(logits, dim=1)
    chooser = logits + gumbel_like(logits) if rsample else gates
    expert = chooser.argmax(dim=1)
    balance, z_loss = _balance_terms(logits, gates, expert)
    counts = torch.bincount(expert, minlength=num_experts)
    capacity = _resolve_capacity(counts, capacity_for(num_tokens, num_experts, capacity_factor, min_capacity),
                                 drop_tokens, max_reduce)
    if use_rts and drop_tokens:
        order = torch.argsort(torch.rand(num_tokens, device=logits.device), descending=True)
        kept = rank_within_expert(expert, order, num_experts) < capacity
    else:
        kept = top1_kept_without_rts(expert, num_experts, capacity)
    expert = torch.where(kept, expert, torch.full_like(expert, -1)).unsqueeze(1)
    weight = gates.gather(1, expert.clamp(min=0)) * kept.unsqueeze(1)
    return Routing(
        expert=expert,
        slot=_token_order_slots(expert, expert >= 0, num_experts),
        weight=weight,
        capacity=capacity,
        num_experts=num_experts,
        aux_loss=balance.sum() * num_experts,
        z_loss=z_loss,
        expert_counts=counts,
        dropped=(~kept).sum(),
    )


def top2_gating(
    logits: torch.Tensor,
    capacity_factor: float,
    min_capacity: int,
    drop_tokens: bool = True,
    second_expert_sampling: bool = True,
    max_reduce: MaxReduce = None,
) -> Routing:
    num_tokens, num_experts = logits.shape
    gates = F.softmax(logits, dim=1)
    first = gates.argmax(dim=1)
    chooser = logits + gumbel_like(logits) if second_expert_sampling else logits
    second = chooser.scatter(1, first.unsqueeze(1), float("-inf")).argmax(dim=1)
    balance, z_loss = _balance_terms(logits, gates, first)
    expert = torch.stack([first, second], dim=1)  # [S, 2]
    counts = torch.bincount(expert.reshape(-1), minlength=num_experts)
    capacity = _resolve_capacity(counts, capacity_for(num_tokens, num_experts, capacity_factor * 2, min_capacity),
                                 drop_tokens, max_reduce)
    # First choices queue before second choices; within each, token order.
    order = torch.arange(2 * num_tokens, device=logits.device).view(num_tokens, 2).t().reshape(-1)
    slot = rank_within_expert(expert.reshape(-1), order, num_experts).view(num_tokens, 2)
    kept = slot < capacity
    gate = gates.gather(1, expert) * kept
    weight = gate / gate.sum(dim=1, keepdim=True).clamp(min=torch.finfo(gate.dtype).eps)
    return Routing(
        expert=torch.where(kept, expert, torch.full_like(expert, -1)),
        slot=slot,
        weight=weight,
        capacity=capacity,
        num_experts=num_experts,
        aux_loss=balance.mean() * num_experts * num_experts,
        z_loss=z_loss,
        expert_counts=counts,
        dropped=(~kept).sum(),
    )


def topk_gating(
    logits: torch.Tensor,
    k: int,
    capacity_factor: float,
    min_capacity: int,
    drop_tokens: bool = True,
    drop_policy: str = "probs",
    max_reduce: MaxReduce = None,
) -> Routing:
    num_tokens, num_experts = logits.shape
    gates = F.softmax(logits, dim=1)
    top_gate, expert = torch.topk(gates, k=k, dim=1)  # [S, k]
    me = gates.mean(0)
    ce = torch.bincount(expert.reshape(-1), minlength=num_experts).float() / num_tokens
    z_loss = torch.logsumexp(logits, dim=-1).pow(2).mean()
    counts = torch.bincount(expert.reshape(-1), minlength=num_experts)
    capacity = _resolve_capacity(counts, capacity_for(num_tokens, num_experts, capacity_factor * k, min_capacity),
                                 drop_tokens, max_reduce)
    flat = expert.reshape(-1)
    if drop_policy == "probs":
        order = torch.argsort(top_gate.reshape(-1).detach(), descending=True, stable=True)
    else:
        order = torch.arange(flat.numel(), device=flat.device)
    kept = (rank_within_expert(flat, order, num_experts) < capacity).view(num_tokens, k)
    gate = top_gate * kept
    weight = gate / gate.sum(dim=1, keepdim=True).clamp(min=torch.finfo(gate.dtype).eps)
    expert = torch.where(kept, expert, torch.full_like(expert, -1))
    return Routing(
        expert=expert,
        slot=_token_order_slots(expert, kept, num_experts),
        weight=weight,
        capacity=capacity,
        num_experts=num_experts,
        aux_loss=(me * ce).mean() * num_experts * num_experts / k,
        z_loss=z_loss,
        expert_counts=counts,
        dropped=(~kept).sum(),
    )
