"""Tensor names and layouts between dsrecipes' GPT and Hugging Face's GPT-2 / Llama / Mistral / Qwen2 / Qwen3.

    hf_state = to_hf_state(model.state_dict(), cfg)                    # names of hf_model_type_for(cfg)
    state = from_hf_state(hf_state, cfg, "llama", source="DIR")       # exactly GPT(cfg).state_dict()'s keys

Differences the maps take care of:
  * dsrecipes fuses keys and values head by head (kv_proj rows [kv_head, k|v, head_dim]); HF keeps
    k_proj / v_proj apart (GPT-2: one c_attn with rows q | k | v).
  * GPT-2's Conv1D stores weights [in, out], the transpose of nn.Linear's.
  * GPT-2 blocks in HF always have biases and full multi-head attention: a bias-free dsrecipes block
    exports zero biases, and grouped-query attention exports each kv head repeated over its query
    heads (what attention computes with them anyway). Importing with dsrecipes' config reverses both,
    checking that what it drops is zeros / repeats.
  * A bias dsrecipes' config has and the checkpoint lacks loads as zeros (same outputs).
  * A tied LM head is stored once, as the embedding (HF's convention); checkpoints' buffers (GPT-2's
    causal mask `attn.bias`, rotary `inv_freq`) are skipped; weights are returned in float32.
"""

from __future__ import annotations

import re

import torch

from dsrecipes.models.config import ModelConfig
from dsrecipes.models.hf_config import hf_model_type_for


class NoHFLayout(ValueError):
    """A state dict that is not a dense dsrecipes GPT of its config (MoE experts, a compression method's extra
    tensors, a reshaped layer): it has no Hugging Face names."""


# Buffers some checkpoints hold that carry no weights.
_BUFFERS = re.compile(r"(\.attn\.(masked_)?bias|\.rotary_emb\.inv_freq)$")


def _split_kv(kv: torch.Tensor, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    rest = kv.shape[1:]
    pairs = kv.reshape(kv_heads, 2, head_dim, *rest)
    return pairs[:, 0].reshape(kv_heads * head_dim, *rest), pairs[:, 1].reshape(kv_heads * head_dim, *rest)


def _join_kv(k: torch.Tensor, v: torch.Tensor, kv_heads: int, head_dim: int) -> torch.Tensor:
    rest = k.shape[1:]
    pairs = torch.stack([k.reshape(kv_heads, head_dim, *rest), v.reshape(kv_heads, head_dim, *rest)], dim=1)
    return pairs.reshape(2 * kv_heads * head_dim, *rest)


def _repeat_heads(x: torch.Tensor, heads: int, head_dim: int, repeat: int) -> torch.Tensor:
    rest = x.shape[1:]
    return x.reshape(heads, head_dim, *rest).repeat_interleave(repeat, dim=0).reshape(heads * repeat * head_dim, *rest)


class HFTensors:
    """A checkpoint's tensors by HF name, each taken once; `finish` reports any that no dsrecipes tensor used."""

    def __init__(self, state: dict, source: str, prefix: str = ""):
        self.state = {name: tensor for name, tensor in state.items() if not _BUFFERS.search(name)}
        self.source, self.prefix = source, prefix

    def take(self, name: str, required: bool = True) -> torch.Tensor | None:
        key = self.prefix + name if name != "lm_head.weight" else name
        tensor = self.state.pop(key, None)
        if tensor is None and required:
            raise ValueError(f"{self.source}: the checkpoint has no tensor {key!r}; is it a complete "
                             "Hugging Face causal-LM checkpoint of its model_type?")
        return None if tensor is None else tensor.to(torch.float32)

    def finish(self) -> None:
        if self.state:
            names = sorted(self.state)
            raise ValueError(f"{self.source}: {len(names)} tensors of the checkpoint have no place in dsrecipes' model "
                             f"(e.g. {', '.join(names[:3])}); its architecture differs from its model_type's")


class DsTensors:
    """Collects dsrecipes tensors; `bias` applies the bias rules of the module docstring."""

    def __init__(self, source: str):
        self.state, self.source = {}, source

    def bias(self, name: str, tensor: torch.Tensor | None, wanted: bool, size: int) -> None:
        if wanted:
            self.state[name] = tensor if tensor is not None else torch.zeros(size)
        elif tensor is not None and bool(tensor.any()):
            raise ValueError(f"{self.source}: the bias for {name} is non-zero, but the model config has no bias there "
                             "(model.bias / model.qkv_bias)")


def _reduce_heads(x: torch.Tensor, cfg: ModelConfig, source: str, name: str) -> torch.Tensor:
    """GPT-2 k/v with n_head heads -> cfg.kv_heads heads, checking that each group repeats one head."""
    repeat = cfg.n_head // cfg.kv_heads
    if repeat == 1:
        return x
    kept = x.reshape(cfg.n_head, cfg.head_dim, *x.shape[1:])[::repeat].reshape(cfg.kv_heads * cfg.head_dim, *x.shape[1:])
    if not torch.equal(_repeat_heads(kept, cfg.kv_heads, cfg.head_dim, repeat), x):
        raise ValueError(f"{source}: {name} holds {cfg.n_head} distinct key/value heads, not model.n_kv_head="
                         f"{cfg.kv_heads} repeated; drop n_kv_head from the model config")
    return kept


# ---------------------------------------------------------------------------------------------- to HF
def to_hf_state(state: dict, cfg: ModelConfig) -> dict:
    """A dsrecipes GPT state dict (dense blocks) in HF names and layouts; NoHFLayout for a tensor with no HF name."""
    left = dict(state)

    def take(name: str, required: bool = True):
        tensor = left.pop(name, None)
        if tensor is None and required:
            raise NoHFLayout(f"the state dict has no {name!r}: not a dense dsrecipes GPT of this config")
        if tensor is None:
            return None
        device = tensor.device if tensor.is_meta else "cpu"  # a meta-built model: names and shapes only
        return tensor.detach().to(device, torch.float32)

    hf = (_gpt2_to_hf if cfg.style == "gpt2" else _llama_to_hf)(take, cfg)
    if cfg.tie_embeddings:
        left.pop("lm_head.weight", None)
    else:
        hf["lm_head.weight"] = take("lm_head.weight")
    if left:
        raise NoHFLayout(f"no Hugging Face name for {len(left)} tensors (e.g. {', '.join(sorted(left)[:3])}); "
                         "the HF layout holds dense gpt2 / llama blocks only")
    return {name: tensor.contiguous() for name, tensor in hf.items()}


def _zero_pair(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(size), torch.zeros(size)  # two tensors: safetensors refuses shared storage


def _zeros_if_none(tensor: torch.Tensor | None, size: int) -> torch.Tensor:
    return tensor if tensor is not None else torch.zeros(size)


def _gpt2_to_hf(take, cfg: ModelConfig) -> dict:
    d, hd, repeat = cfg.d_model, cfg.head_dim, cfg.n_head // cfg.kv_heads

    def bias(name: str, size: int) -> torch.Tensor:  # HF GPT-2 always has one: zeros where dsrecipes has none
        return _zeros_if_none(take(name, False), size)

    hf = {"transformer.wte.weight": take("tok_emb.weight"), "transformer.wpe.weight": take("pos_emb.weight"),
          "transformer.ln_f.weight": take("final_norm.weight"), "transformer.ln_f.bias": bias("final_norm.bias", d)}
    for i in range(cfg.n_layer):
        b, h = f"blocks.{i}.", f"transformer.h.{i}."
        k, v = _split_kv(take(b + "attn.kv_proj.weight"), cfg.kv_heads, hd)
        kv_bias = take(b + "attn.kv_proj.bias", False)
        kb, vb = _split_kv(kv_bias, cfg.kv_heads, hd) if kv_bias is not None else _zero_pair(cfg.kv_heads * hd)
        k, v, kb, vb = (_repeat_heads(t, cfg.kv_heads, hd, repeat) for t in (k, v, kb, vb))
        hf.update({
            h + "ln_1.weight": take(b + "attn_norm.weight"), h + "ln_1.bias": bias(b + "attn_norm.bias", d),
            h + "attn.c_attn.weight": torch.cat([take(b + "attn.q_proj.weight"), k, v]).T,
            h + "attn.c_attn.bias": torch.cat([bias(b + "attn.q_proj.bias", d), kb, vb]),
            h + "attn.c_proj.weight": take(b + "attn.out_proj.weight").T,
            h + "attn.c_proj.bias": bias(b + "attn.out_proj.bias", d),
            h + "ln_2.weight": take(b + "mlp_norm.weight"), h + "ln_2.bias": bias(b + "mlp_norm.bias", d),
            h + "mlp.c_fc.weight": take(b + "mlp.fc_in.weight").T, h + "mlp.c_fc.bias": bias(b + "mlp.fc_in.bias", cfg.ffn_dim),
            h + "mlp.c_proj.weight": take(b + "mlp.fc_out.weight").T, h + "mlp.c_proj.bias": bias(b + "mlp.fc_out.bias", d),
        })
    return hf


def _llama_to_hf(take, cfg: ModelConfig) -> dict:
    qwen2 = hf_model_type_for(cfg) == "qwen2"  # qwen3's attention_bias covers o_proj too, as llama's
    attn_bias = cfg.bias or cfg.attn_qkv_bias  # HF Llama: attention_bias covers q, k, v and o alike
    hd = cfg.head_dim
    hf = {"model.embed_tokens.weight": take("tok_emb.weight"), "model.norm.weight": take("final_norm.weight")}
    for i in range(cfg.n_layer):
        b, h = f"blocks.{i}.", f"model.layers.{i}."
        k, v = _split_kv(take(b + "attn.kv_proj.weight"), cfg.kv_heads, hd)
        hf.update({h + "input_layernorm.weight": take(b + "attn_norm.weight"),
                   h + "self_attn.q_proj.weight": take(b + "attn.q_proj.weight"),
                   h + "self_attn.k_proj.weight": k, h + "self_attn.v_proj.weight": v,
                   h + "self_attn.o_proj.weight": take(b + "attn.out_proj.weight"),
                   h + "post_attention_layernorm.weight": take(b + "mlp_norm.weight"),
                   h + "mlp.gate_proj.weight": take(b + "mlp.gate.weight"),
                   h + "mlp.up_proj.weight": take(b + "mlp.up.weight"),
                   h + "mlp.down_proj.weight": take(b + "mlp.fc_out.weight")})
        if cfg.qk_norm:
            hf.update({h + "self_attn.q_norm.weight": take(b + "attn.q_norm.weight"),
                       h + "self_attn.k_norm.weight": take(b + "attn.k_norm.weight")})
        if attn_bias:
            kv_bias = take(b + "attn.kv_proj.bias", False)
            kb, vb = _split_kv(kv_bias, cfg.kv_heads, hd) if kv_bias is not None else _zero_pair(cfg.kv_heads * hd)
            hf.update({h + "self_attn.q_proj.bias": _zeros_if_none(take(b + "attn.q_proj.bias", False), cfg.d_model),
                       h + "self_attn.k_proj.bias": kb, h + "self_attn.v_proj.bias": vb})
            if not qwen2:
                hf[h + "self_attn.o_proj.bias"] = _zeros_if_none(take(b + "attn.out_proj.bias", False), cfg.d_model)
        if cfg.bias:
            for ours, theirs, size in (("gate", "gate_proj", cfg.ffn_dim), ("up", "up_proj", cfg.ffn_dim),
                                       ("fc_out", "down_proj", cfg.d_model)):
                hf[h + f"mlp.{theirs}.bias"] = _zeros_if_none(take(b + f"mlp.{ours}.bias", False), size)
    return hf


# -------------------------------------------------------------------------------------------- from HF
def from_hf_state(hf_state: dict, cfg: ModelConfig, model_type: str, source: str) -> dict:
    """HF tensors -> the state dict of GPT(cfg) (float32); ValueError naming a missing or unplaceable tensor."""
    if model_type == "gpt2":
        prefix = "transformer." if any(k.startswith("transformer.") for k in hf_state) else ""
        hf, ds = HFTensors(hf_state, source, prefix), DsTensors(source)
        _gpt2_from_hf(hf, ds, cfg)
    else:
        prefix = "model." if any(k.startswith("model.") for k in hf_state) else ""
        hf, ds = HFTensors(hf_state, source, prefix), DsTensors(source)
        _llama_from_hf(hf, ds, cfg)
    lm_head = hf.take("lm_head.weight", required=not cfg.tie_embeddings)  # a tied one, if stored too, is the embedding
    ds.state["lm_head.weight"] = ds.state["tok_emb.weight"] if cfg.tie_embeddings else lm_head
    hf.finish()
    return ds.state


def _gpt2_from_hf(hf: HFTensors, ds: DsTensors, cfg: ModelConfig) -> None:
    d, bias = cfg.d_model, cfg.bias
    wpe = hf.take("wpe.weight")
    if wpe.shape[0] < cfg.max_seq_len:
        raise ValueError(f"{hf.source}: the checkpoint has {wpe.shape[0]} positions, fewer than model.max_seq_len="
                         f"{cfg.max_seq_len}")
    ds.state.update({"tok_emb.weight": hf.take("wte.weight"), "pos_emb.weight": wpe[: cfg.max_seq_len].clone(),
                     "final_norm.weight": hf.take("ln_f.weight")})
    ds.bias("final_norm.bias", hf.take("ln_f.bias"), bias, d)
    for i in range(cfg.n_layer):
        h, b = f"h.{i}.", f"blocks.{i}."
        q, k, v = hf.take(h + "attn.c_attn.weight").T.split(d, dim=0)
        qb, kb, vb = hf.take(h + "attn.c_attn.bias").split(d)
        k, v = (_reduce_heads(t, cfg, hf.source, f"{h}attn.c_attn") for t in (k, v))
        ds.state.update({b + "attn_norm.weight": hf.take(h + "ln_1.weight"), b + "attn.q_proj.weight": q.clone(),
                         b + "attn.kv_proj.weight": _join_kv(k, v, cfg.kv_heads, cfg.head_dim),
                         b + "attn.out_proj.weight": hf.take(h + "attn.c_proj.weight").T.contiguous(),
                         b + "mlp_norm.weight": hf.take(h + "ln_2.weight"),
                         b + "mlp.fc_in.weight": hf.take(h + "mlp.c_fc.weight").T.contiguous(),
                         b + "mlp.fc_out.weight": hf.take(h + "mlp.c_proj.weight").T.contiguous()})
        ds.bias(b + "attn_norm.bias", hf.take(h + "ln_1.bias"), bias, d)
        ds.bias(b + "attn.q_proj.bias", qb.clone(), cfg.attn_qkv_bias, d)
        kb, vb = (_reduce_heads(t, cfg, hf.source, f"{h}attn.c_attn.bias") for t in (kb, vb))
        ds.bias(b + "attn.kv_proj.bias", _join_kv(kb, vb, cfg.kv_heads, cfg.head_dim), cfg.attn_qkv_bias, 0)
        ds.bias(b + "attn.out_proj.bias", hf.take(h + "attn.c_proj.bias"), bias, d)
        ds.bias(b + "mlp_norm.bias", hf.take(h + "ln_2.bias"), bias, d)
        ds.bias(b + "mlp.fc_in.bias", hf.take(h + "mlp.c_fc.bias"), bias, cfg.ffn_dim)
        ds.bias(b + "mlp.fc_out.bias", hf.take(h + "mlp.c_proj.bias"), bias, d)


def _llama_from_hf(hf: HFTensors, ds: DsTensors, cfg: ModelConfig) -> None:
    d, kv_size, bias = cfg.d_model, cfg.kv_heads * cfg.head_dim, cfg.bias
    ds.state.update({"tok_emb.weight": hf.take("embed_tokens.weight"), "final_norm.weight": hf.take("norm.weight")})
    for i in range(cfg.n_layer):
        h, b = f"layers.{i}.", f"blocks.{i}."
        a = h + "self_attn."
        ds.state.update({b + "attn_norm.weight": hf.take(h + "input_layernorm.weight"),
                         b + "attn.q_proj.weight": hf.take(a + "q_proj.weight"),
                         b + "attn.kv_proj.weight": _join_kv(hf.take(a + "k_proj.weight"), hf.take(a + "v_proj.weight"),
                                                             cfg.kv_heads, cfg.head_dim),
                         b + "attn.out_proj.weight": hf.take(a + "o_proj.weight"),
                         b + "mlp_norm.weight": hf.take(h + "post_attention_layernorm.weight"),
                         b + "mlp.gate.weight": hf.take(h + "mlp.gate_proj.weight"),
                         b + "mlp.up.weight": hf.take(h + "mlp.up_proj.weight"),
                         b + "mlp.fc_out.weight": hf.take(h + "mlp.down_proj.weight")})
        if cfg.qk_norm:
            ds.state.update({b + "attn.q_norm.weight": hf.take(a + "q_norm.weight"),
                             b + "attn.k_norm.weight": hf.take(a + "k_norm.weight")})
        kb, vb = hf.take(a + "k_proj.bias", False), hf.take(a + "v_proj.bias", False)
        kv_bias = None if kb is None and vb is None else _join_kv(
            _zeros_if_none(kb, kv_size), _zeros_if_none(vb, kv_size), cfg.kv_heads, cfg.head_dim)
        ds.bias(b + "attn.q_proj.bias", hf.take(a + "q_proj.bias", False), cfg.attn_qkv_bias, d)
        ds.bias(b + "attn.kv_proj.bias", kv_bias, cfg.attn_qkv_bias, 2 * kv_size)
        ds.bias(b + "attn.out_proj.bias", hf.take(a + "o_proj.bias", False), bias, d)
        ds.bias(b + "mlp.gate.bias", hf.take(h + "mlp.gate_proj.bias", False), bias, cfg.ffn_dim)
        ds.bias(b + "mlp.up.bias", hf.take(h + "mlp.up_proj.bias", False), bias, cfg.ffn_dim)
        ds.bias(b + "mlp.fc_out.bias", hf.take(h + "mlp.down_proj.bias", False), bias, d)
