"""Packed documents in one row: each attends only to itself, at positions that restart with it.

    mask = document_causal_mask(position_ids)          # [B, 1, T, T] bool: same document and not in the future
    cos, sin = rope_at(cos_table, sin_table, position_ids)   # [B, 1, T, D/2]: each token's own position

A row packed by data.packing=documents (dsrecipes.data.sample_packing) carries position_ids that restart at 0 for
every document. Documents are told apart the way transformers tells them apart (its find_packed_sequence_indices):
a new document starts wherever a position is not the previous one plus one. With that mask and those positions,
every document of the row gets exactly the logits it has alone (checked by tests/unit/test_instruction_data.py).
"""

from __future__ import annotations

import torch


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] index of the document each token belongs to (0, 0, 1, 1, 1, 2, ...)."""
    first = position_ids[:, :1] - 1
    return (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)


def document_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] boolean attention mask (True = attend): key j is in query i's document and j <= i."""
    docs = document_ids(position_ids)
    seq = position_ids.shape[-1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=position_ids.device).tril()
    return ((docs[:, :, None] == docs[:, None, :]) & causal)[:, None]


def rope_at(cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary tables' rows at each token's position, shaped [B, 1, T, D/2] to broadcast over the heads."""
    return cos[position_ids][:, None], sin[position_ids][:, None]
