"""Putting a complete state dict into a GPT built on the meta device: what every loader of saved weights does.

Shared by dsrecipes' own export layout (dsrecipes.models.export) and the Hugging Face import
(dsrecipes.models.hf_import), so that neither imports the other for it.
"""

from __future__ import annotations

import torch

from dsrecipes.models.gpt import GPT


def assign_state(model: GPT, state: dict, device: str | torch.device = "cpu", tie: bool = True) -> GPT:
    """Assign `state` (all of the model's tensors) to a meta-built `model` on `device`; re-tie, rebuild rope."""
    model.load_state_dict(state, assign=True)
    if model.cfg.tie_embeddings and tie:
        model.lm_head.weight = model.tok_emb.weight
    if model.cfg.style == "llama":
        model.rope_cos = torch.empty_like(model.rope_cos, device=device)
        model.rope_sin = torch.empty_like(model.rope_sin, device=device)
        model.init_rope()
    return model.to(device)
