"""Plain autoregressive sampling (temperature, top-k) without a KV cache.

Enough for the short text sample that ends a training run (the Trainer uses it); the inference
engine (dsrecipes.inference: KV cache, fused kernels, tensor parallel) is a separate, faster path.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor


@torch.no_grad()
def sample_tokens(
    model: nn.Module,
    prompt_ids: list[int],
    max_new_tokens: int,
    max_seq_len: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    stop_id: int | None = None,
) -> list[int]:
    """Continue `prompt_ids` by up to `max_new_tokens` ids (greedy when temperature == 0)."""
    was_training = model.training
    model.eval()
    generator = torch.Generator(device=device).manual_seed(seed)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    new_ids: list[int] = []
    shards = getattr(model, "activation_seq_shards", 1)
    for _ in range(max_new_tokens):
        window = ids[:, -max_seq_len:]
        if window.shape[1] % shards and window.shape[1] + shards > max_seq_len:
            window = window[:, window.shape[1] % shards:]  # drop the oldest tokens instead of padding past the context
        n = window.shape[1]
        if n % shards:  # sequence-parallel tensor parallelism needs seq % tp == 0: right padding, which a
            window = torch.cat([window, window.new_zeros(1, -n % shards)], dim=1)  # causal model never sees
        logits = model(window).logits
        if isinstance(logits, DTensor):  # vocab-sharded logits of a tensor-parallel model
            logits = logits.full_tensor()
        logits = logits[0, n - 1].float()
        if temperature <= 0:
            next_id = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            next_id = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
        if stop_id is not None and next_id == stop_id:
            break
        new_ids.append(next_id)
        ids = torch.cat([ids, torch.tensor([[next_id]], device=device)], dim=1)
    model.train(was_training)
    return new_ids
