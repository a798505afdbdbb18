"""Turning next-token logits into next tokens: repetition penalty, temperature, top-k, top-p, sampling.

    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, repetition_penalty=1.1)
    next_ids = choose_next_tokens(logits, params, seen, generator)   # logits [B, V] -> ids [B]

Semantics follow Hugging Face's generate (which DeepSpeed-Inference serves through):
  * repetition_penalty p (1 = off): the logit of every token already in the row (prompt or
    generated) is divided by p when positive and multiplied by p when negative (CTRL paper);
  * temperature 0 means greedy (argmax); otherwise logits / temperature;
  * top_k keeps the k largest logits (0 = off); top_p keeps the smallest set of tokens whose
    probability sums to at least top_p (the most likely token is always kept; 1 = off);
  * sampling uses torch.multinomial with the caller's torch.Generator, so a seed fixes the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    repetition_penalty: float = 1.0  # 1 = off

    def validate(self, prefix: str = "generate") -> None:
        if self.temperature < 0:
            raise ValueError(f"{prefix}.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ValueError(f"{prefix}.top_k={self.top_k} must be >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"{prefix}.top_p={self.top_p} must be in (0, 1] (1 = off)")
        if self.repetition_penalty <= 0:
            raise ValueError(f"{prefix}.repetition_penalty={self.repetition_penalty} must be > 0 (1 = off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits [B, V] fp32, seen [B, V] bool (tokens present in each row so far)."""
    if penalty == 1.0:
        return logits
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cumulative = sorted_logits.softmax(-1).cumsum(-1)
    # drop a token when the tokens before it already reach p (so the top token always stays)
    drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def choose_next_tokens(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ids [B] (long) from logits [B, V]."""
    logits = logits.float()
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, params.repetition_penalty)
    if params.greedy:
        return logits.argmax(-1)
    logits = filter_top_p(filter_top_k(logits / params.temperature, params.top_k), params.top_p)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
