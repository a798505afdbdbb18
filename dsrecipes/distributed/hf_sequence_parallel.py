"""Ulysses sequence parallelism inside a Hugging Face module, through transformers' attention-function registry.

    check_hf_sequence_parallel(hf_model, sp, block_size)   # ValueError naming parallel.sp when it cannot apply
    count = install_hf_ulysses(hf_model, group)            # every attention module runs Ulysses around its SDPA

transformers' attention modules call the function their config's `_attn_implementation` names in
`ALL_ATTENTION_FUNCTIONS` with q [B, H, T/P, D], k and v [B, Hkv, T/P, D] (this rank's chunk of the sequence, as
dsrecipes.distributed.sequence_parallel cuts it; the wrapper passes the chunk's positions as position_ids, so the
rotary embedding rotates the true positions). dsrecipes registers "dsrecipes_ulysses": the all-to-alls of
dsrecipes.distributed.sequence_parallel.UlyssesAttention (sequence sharding -> head sharding and back), and between
them causal SDPA over the whole sequence with the module's own scaling (Gemma's query_pre_attn_scalar too). A name
transformers has no mask function for gets no mask from it: the attention is plainly causal, which is what every
layer computes when it has no padding and no window shorter than the sequence. So a model whose attention is more
than causal (a sliding window shorter than data.block_size, logit soft-capping) is refused by name, as are the
heads that do not divide (as for dsrecipes' own attention).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from dsrecipes.distributed.sequence_parallel import UlyssesAttention
from dsrecipes.models.decoder_layers import text_config

ULYSSES = "dsrecipes_ulysses"
_ATTRIBUTE = "_dsrecipes_ulysses"  # the UlyssesAttention of an attention module, set by install_hf_ulysses


def _windows(config) -> list[int]:
    """The attention windows of the config's layers (sliding windows that apply)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    if not window:
        return []
    if layer_types:
        return [window] if "sliding_attention" in layer_types else []
    return [window] if getattr(config, "use_sliding_window", True) else []


def check_hf_sequence_parallel(hf_model: nn.Module, sp: int, block_size: int) -> None:
    """ValueError naming parallel.sp when Ulysses cannot run this model's attention exactly."""
    config = text_config(hf_model)
    kind = type(hf_model).__name__
    heads = getattr(config, "num_attention_heads", None)
    if not heads or heads % sp:
        valid = [d for d in range(1, (heads or 1) + 1) if heads and heads % d == 0]
        raise ValueError(f"parallel.sp={sp} does not divide {kind}'s num_attention_heads={heads}: Ulysses gives each "
                         f"sp rank whole heads; valid parallel.sp values: {', '.join(map(str, valid))}")
    for window in _windows(config):
        if window < block_size:
            raise ValueError(f"parallel.sp={sp} with {kind}'s sliding_window={window} < data.block_size={block_size}: "
                             "Ulysses runs plainly causal attention over the whole sequence; use data.block_size <= "
                             f"{window} or parallel.sp=1")
    for key in ("attn_logit_softcapping",):
        if getattr(config, key, None):
            raise ValueError(f"parallel.sp={sp} with {kind}'s {key}={getattr(config, key)}: Ulysses runs SDPA, "
                             "which has no soft-capping; use parallel.sp=1")


def attention_modules(hf_model: nn.Module) -> list[nn.Module]:
    """The modules that call the attention function: those holding the config and the `is_causal` flag."""
    return [m for m in hf_model.modules() if hasattr(m, "is_causal") and hasattr(m, "config")
            and type(m).__name__.endswith("Attention")]


def _causal_sdpa(scaling, dropout):
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if k.shape[1] != q.shape[1]:
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, dropout_p=dropout)
    return attend


def ulysses_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask, scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """transformers' attention-function signature: (output [B, T/P, H, D], no weights)."""
    ulysses: UlyssesAttention = getattr(module, _ATTRIBUTE)
    window = kwargs.get("sliding_window")
    length = query.shape[2] * ulysses.size
    if window and window < length:
        raise ValueError(f"Ulysses attention over {length} tokens met a sliding window of {window}; use parallel.sp=1")
    return ulysses.attend(query, key, value, _causal_sdpa(scaling, dropout)).transpose(1, 2), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ULYSSES, ulysses_attention_forward)


def install_hf_ulysses(hf_model: nn.Module, group) -> int:
    """Route every attention module of `hf_model` through Ulysses over `group`; returns how many."""
    _register()
    modules = attention_modules(hf_model)
    for module in modules:
        setattr(module, _ATTRIBUTE, UlyssesAttention(None, group))
    hf_model.config._attn_implementation = ULYSSES
    for sub in hf_model.modules():  # text sub-configs carry the name too
        config = getattr(sub, "config", None)
        if config is not None and config is not hf_model.config and hasattr(config, "_attn_implementation"):
            config._attn_implementation = ULYSSES
    return len(modules)


@contextlib.contextmanager
def hf_ulysses_disabled(model: nn.Module):
    """The module's attention back on plain SDPA for the duration (whole sequences on one rank: text samples)."""
    configs = {id(m.config): m.config for m in model.modules()
               if getattr(getattr(m, "config", None), "_attn_implementation", None) == ULYSSES}
    try:
        for config in configs.values():
            config._attn_implementation = "sdpa"
        yield model
    finally:
        for config in configs.values():
            config._attn_implementation = ULYSSES
