"""Batched autoregressive generation over a KV cache: prefill once, then one token per step.

    result = generate(decoder, [[5, 6, 7], [8, 9]], max_new_tokens=32, params=SamplingParams(), seed=0)
    result.tokens        # [[...], [...]] new tokens per prompt (stop token excluded)

Prompts of different lengths are left padded to the longest; each row keeps its own positions and
never attends to its padding (dsrecipes.inference.decoder), so a prompt yields the same tokens
batched as alone. Stop tokens end their row (the row then idles on the pad id while the others
continue); generation ends when every row stopped or max_new_tokens were produced. The cache is
allocated once for prompt + max_new_tokens slots (or a caller's cache reused); every step writes
one slot in place. Sampling draws from one torch.Generator seeded with `seed`, so a seed fixes the
output. Under tensor parallelism every rank computes identical logits; the chosen tokens are still
broadcast from rank 0 of the group so the ranks cannot drift apart.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from dsrecipes.inference.decoder import CachedDecoder
from dsrecipes.inference.kv_cache import KVCache
from dsrecipes.inference.logits_processing import SamplingParams, choose_next_tokens

# on_token(step, token_ids [B] (long, CPU), finished [B] (bool, CPU)) after every generated token
TokenCallback = Callable[[int, torch.Tensor, torch.Tensor], None]


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # new tokens per prompt, stop token excluded
    finish_reasons: list[str]  # "stop" (a stop token) or "length" (max_new_tokens)
    prompt_lengths: list[int]
    prefill_s: float = 0.0  # prompt forward + first token (time to first token)
    decode_s: float = 0.0  # the remaining steps
    decode_steps: int = 0  # forward passes after the prefill
    step_latencies_s: list[float] = field(default_factory=list)

    @property
    def new_token_count(self) -> int:
        return sum(len(t) for t in self.tokens)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int, max_seq_len: int, key: str = "prompt") -> None:
    """ValueError for an empty batch, an empty prompt, an out-of-vocabulary id or a prompt longer than the context."""
    if not prompts:
        raise ValueError(f"{key}: no prompts given")
    for index, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"{key}: prompt {index} is empty; give at least one token")
        if len(prompt) > max_seq_len:
            raise ValueError(f"{key}: prompt {index} has {len(prompt)} tokens, longer than the model's context "
                             f"model.max_seq_len={max_seq_len}; shorten it")
        bad = [t for t in prompt if not 0 <= int(t) < vocab_size]
        if bad:
            raise ValueError(f"{key}: prompt {index} has token ids outside [0, {vocab_size}): {bad[:5]}")


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, P] left padded with pad_id, start [B] = number of pad slots per row)."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long)
    start = torch.tensor([longest - len(p) for p in prompts], dtype=torch.long)
    return ids.to(device), start.to(device)


@torch.no_grad()
def generate(
    decoder: CachedDecoder,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    params: SamplingParams | None = None,
    stop_ids: Sequence[int] = (),
    seed: int = 0,
    pad_id: int = 0,
    on_token: TokenCallback | None = None,
    cache: KVCache | None = None,
    tp_group=None,
) -> GenerationResult:
    """Generate up to max_new_tokens per prompt; see the module docstring."""
    params = params or SamplingParams()
    params.validate()
    cfg = decoder.cfg
    vocab = decoder.model.lm_head.out_features if hasattr(decoder.model.lm_head, "out_features") else cfg.vocab_size
    check_prompts(prompts, vocab, cfg.max_seq_len)
    outside = [t for t in stop_ids if not 0 <= int(t) < vocab]
    if outside:
        raise ValueError(f"generate.stop_tokens={list(stop_ids)}: {outside} lie outside the model's vocabulary "
                         f"[0, {vocab}), so generation could never stop on them; give ids below {vocab} "
                         f"(or [] for none, null for the tokenizer's end-of-sequence id)")
    if max_new_tokens < 0:
        raise ValueError(f"generate.max_new_tokens={max_new_tokens} must be >= 0")
    longest = max(len(p) for p in prompts)
    budget = cfg.max_seq_len - longest
    if max_new_tokens > budget:
        warnings.warn(f"generate.max_new_tokens={max_new_tokens} does not fit the context: the longest prompt has "
                      f"{longest} tokens and model.max_seq_len={cfg.max_seq_len}; generating at most {budget}", stacklevel=2)
        max_new_tokens = budget
    device = decoder.model.tok_emb.weight.device
    ids, start = left_pad(prompts, pad_id, device)
    batch = len(prompts)
    capacity = longest + max_new_tokens
    if cache is None or not cache.fits(cfg.n_layer, batch, cache.keys.shape[2], capacity, cache.keys.shape[4],
                                       decoder.model.tok_emb.weight.dtype, device):
        cache = decoder.allocate_cache(batch, capacity)
    cache = cache.view(batch)
    cache.reset(start)

    seen = torch.zeros(batch, vocab, dtype=torch.bool, device=device)
    for row, prompt in enumerate(prompts):
        seen[row, torch.as_tensor(list(prompt), device=device)] = True
    stop = torch.as_tensor(list(stop_ids), dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    out = torch.full((batch, max(max_new_tokens, 1)), pad_id, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)

    result = GenerationResult([[] for _ in prompts], ["length"] * batch, [len(p) for p in prompts])
    _sync(device)
    t0 = time.perf_counter()
    logits = decoder.forward(ids, cache) if max_new_tokens else None
    steps = 0
    for step in range(max_new_tokens):
        next_ids = choose_next_tokens(logits, params, seen if params.repetition_penalty != 1.0 else None, generator)
        if tp_group is not None:
            torch.distributed.broadcast(next_ids, group=tp_group, group_src=0)
        hit_stop = torch.isin(next_ids, stop) & ~finished if stop.numel() else torch.zeros_like(finished)
        stopped |= hit_stop
        finished |= hit_stop
        next_ids = next_ids.masked_fill(finished, pad_id)
        out[:, step] = next_ids
        lengths += (~finished).long()
        seen[torch.arange(batch, device=device), next_ids] |= ~finished
        if on_token is not None:
            on_token(step, next_ids.cpu(), finished.cpu())
        _sync(device)
        now = time.perf_counter()
        if step == 0:
            result.prefill_s = now - t0
        else:
            result.step_latencies_s.append(now - t0)
        t0 = now
        if step + 1 == max_new_tokens or bool(finished.all()):
            break
        logits = decoder.decode(next_ids[:, None], cache)
        steps += 1
    result.decode_steps = steps
    result.decode_s = sum(result.step_latencies_s)
    out, lengths, stopped = out.cpu(), lengths.cpu(), stopped.cpu()
    for row in range(batch):
        result.tokens[row] = out[row, : int(lengths[row])].tolist()
        if stopped[row]:
            result.finish_reasons[row] = "stop"
    return result
