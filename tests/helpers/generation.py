"""The reference for generation tests: greedy decoding by recomputing the whole sequence every token."""

from __future__ import annotations

import torch

from dsrecipes.models import GPT


def no_cache_greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    """Reference: the model's own forward over the whole sequence for every new token."""
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]
