"""Hugging Face config.json <-> ModelConfig, for the causal LMs whose blocks are dsrecipes' own.

    cfg = model_config_from_hf(json.loads(Path("DIR/config.json").read_text()), source="DIR")
    hf = hf_config_for(cfg, bos_id=256, eos_id=256)     # {"model_type": "gpt2", "architectures": [...], ...}
    cfg = model_config_from_dir("DIR")                   # what `model=hf model.path=DIR` composes

gpt2 -> style gpt2 (LayerNorm, tanh GELU = HF's "gelu_new", learned positions, biases); llama, mistral and
qwen2 -> style llama (RMSNorm, SwiGLU, rotary embeddings: dsrecipes rotates the halves (x[:d/2], x[d/2:])
of each head, which is HF Llama's rotate_half layout, so q/k weights map unpermuted; grouped-query
attention). What dsrecipes' blocks cannot compute (another activation, scaled rotary embeddings, a
head_dim other than hidden/heads, per-layer attention scaling) is refused in one line naming the key.

An export written by dsrecipes keeps its own ModelConfig under config.json's "dsrecipes" key, for
what the HF layout cannot say (a bias-free GPT-2 block, grouped-query attention in a GPT-2 block);
it is used when it agrees with the HF fields, so a checkpoint transformers saved again after
changing its shape is read from the HF fields. This module reads JSON only (no torch), so the
`hf_model` resolver of conf/model/hf.yaml stays cheap.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import warnings
from pathlib import Path

from dsrecipes.models.config import ModelConfig, validate_model_config

CONFIG_FILE = "config.json"
DSRECIPES_KEY = "dsrecipes"  # dsrecipes' own record inside an HF config.json
SUPPORTED_MODEL_TYPES = ("gpt2", "llama", "mistral", "qwen2")
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")  # both are the tanh approximation dsrecipes computes
# Fields whose HF value must agree with the "dsrecipes" record for the record to be used.
_AGREEING = ("n_layer", "d_model", "vocab_size", "max_seq_len", "norm_eps", "tie_embeddings")


def is_hf_config(config: dict) -> bool:
    """A Hugging Face config.json (it has a model_type), as opposed to dsrecipes' own export layout."""
    return isinstance(config, dict) and "model_type" in config


def model_type_of(config: dict, source: str) -> str:
    """config.json's model_type; ValueError naming it and the supported ones."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{source}: model_type {model_type!r} is not supported; dsrecipes imports Hugging Face "
                         f"checkpoints of model_type {', '.join(SUPPORTED_MODEL_TYPES)} into its GPT (a causal LM "
                         "of another type trains as it is through dsrecipes.initialize(model=AutoModelForCausalLM"
                         ".from_pretrained(DIR)), zero.stage 0-3)")
    return model_type


def _refuse(source: str, key: str, value, why: str) -> None:
    raise ValueError(f"{source}: config.json has {key}={value!r}, which dsrecipes' blocks cannot compute ({why})")


def _rope_theta(config: dict, source: str) -> float:
    """rope_theta from transformers 5's rope_parameters or 4.x's rope_theta / rope_scaling; only unscaled RoPE."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        _refuse(source, "rope_type", rope_type, "dsrecipes has unscaled rotary embeddings only: rope_type default")
    return float(params.get("rope_theta") or config.get("rope_theta") or 10000.0)


def _sliding_window(config: dict, model_type: str) -> int | None:
    """The attention window of a Mistral / Qwen2 checkpoint, or None where every layer attends to all tokens."""
    window = config.get("sliding_window")
    if model_type == "qwen2":
        sliding_layers = "sliding_attention" in (config.get("layer_types") or [])
        return window if window and (config.get("use_sliding_window") or sliding_layers) else None
    return window if model_type == "mistral" else None


def _gpt2_fields(config: dict, source: str) -> dict:
    activation = config.get("activation_function", "gelu_new")
    if activation not in GPT2_ACTIVATIONS:
        _refuse(source, "activation_function", activation, f"dsrecipes' GELU is the tanh one: {', '.join(GPT2_ACTIVATIONS)}")
    if config.get("scale_attn_by_inverse_layer_idx"):
        _refuse(source, "scale_attn_by_inverse_layer_idx", True, "attention scores are scaled by 1/sqrt(head_dim) only")
    if not config.get("scale_attn_weights", True):
        _refuse(source, "scale_attn_weights", False, "attention scores are always scaled by 1/sqrt(head_dim)")
    if config.get("add_cross_attention"):
        _refuse(source, "add_cross_attention", True, "decoder-only blocks have no cross-attention")
    d_model = config["n_embd"]
    return dict(style="gpt2", n_layer=config["n_layer"], n_head=config["n_head"], d_model=d_model,
                d_ff=config.get("n_inner") or 4 * d_model, vocab_size=config["vocab_size"],
                max_seq_len=config["n_positions"], bias=True, norm_eps=config.get("layer_norm_epsilon", 1e-5),
                tie_embeddings=config.get("tie_word_embeddings", True))


def _llama_fields(config: dict, model_type: str, source: str) -> dict:
    if config.get("hidden_act", "silu") != "silu":
        _refuse(source, "hidden_act", config["hidden_act"], "the SwiGLU MLP uses silu")
    d_model, n_head = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim")
    if head_dim not in (None, d_model // n_head):
        _refuse(source, "head_dim", head_dim, f"the head size is hidden_size/num_attention_heads = {d_model // n_head}")
    n_kv = config.get("num_key_value_heads") or n_head
    if model_type == "qwen2":  # q/k/v projections with biases, none elsewhere
        bias, qkv_bias = False, True
    elif model_type == "llama":  # attention_bias covers q/k/v/o, mlp_bias the MLP; a missing one loads as zeros
        bias = bool(config.get("attention_bias") or config.get("mlp_bias"))
        qkv_bias = None if bias == bool(config.get("attention_bias")) else bool(config.get("attention_bias"))
    else:
        bias, qkv_bias = False, None
    max_seq_len = config.get("max_position_embeddings", 2048)
    window = _sliding_window(config, model_type)
    if window and window < max_seq_len:
        warnings.warn(f"{source}: sliding_window={window} < max_position_embeddings={max_seq_len}; dsrecipes attends "
                      f"to every earlier token, which equals the window up to {window} tokens: model.max_seq_len={window}",
                      stacklevel=3)
        max_seq_len = window
    return dict(style="llama", n_layer=config["num_hidden_layers"], n_head=n_head, n_kv_head=None if n_kv == n_head else n_kv,
                d_model=d_model, d_ff=config["intermediate_size"], vocab_size=config["vocab_size"], max_seq_len=max_seq_len,
                bias=bias, qkv_bias=qkv_bias, norm_eps=config.get("rms_norm_eps", 1e-6),
                rope_theta=_rope_theta(config, source), tie_embeddings=config.get("tie_word_embeddings", False))


def model_config_from_hf(config: dict, source: str = "config.json", name: str | None = None) -> ModelConfig:
    """The ModelConfig of a Hugging Face config.json (dsrecipes' own record when it agrees); ValueError when unsupported."""
    model_type = model_type_of(config, source)
    fields = _gpt2_fields(config, source) if model_type == "gpt2" else _llama_fields(config, model_type, source)
    cfg = ModelConfig(name=name or model_type, init_std=config.get("initializer_range", 0.02), **fields)
    own = config.get(DSRECIPES_KEY, {}).get("model")
    if own:
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        recorded = ModelConfig(**{k: v for k, v in own.items() if k in known})
        if all(getattr(recorded, k) == getattr(cfg, k) for k in _AGREEING) and recorded.ffn_dim == cfg.ffn_dim \
                and recorded.style == cfg.style and recorded.n_head == cfg.n_head:
            cfg = recorded
        else:
            warnings.warn(f"{source}: its {DSRECIPES_KEY!r} record does not match the Hugging Face fields (saved again "
                          "by transformers after a change?); the Hugging Face fields are used", stacklevel=2)
    validate_model_config(cfg, prefix=f"{source}: model")
    return cfg


def _hub_snapshot(name: str) -> Path:
    """A hub repository's config, weights and tokenizer in the local Hugging Face cache (downloaded when online)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(f"model.path={name!r} is not a directory (a hub name needs huggingface_hub: "
                         "pip install dsrecipes[hf])") from None
    patterns = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer*",
                "special_tokens_map.json", "*.jinja"]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as err:  # offline, unknown repo, gated: one line naming it
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"model.path={name!r} is not a directory and was not found on the Hugging Face Hub "
                         f"or in its cache ({reason})") from None


def resolve_checkpoint_dir(path: str | os.PathLike) -> Path:
    """The directory of a Hugging Face checkpoint: `path` itself, or a hub name's snapshot (owner/name)."""
    path = Path(path)
    if path.is_dir():
        return path
    name = str(path)
    if not path.exists() and name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return _hub_snapshot(name)
    raise ValueError(f"model.path={name!r} is not a Hugging Face checkpoint directory (config.json + weights) "
                     "or a hub name (owner/name)")


def read_hf_config(path: str | os.PathLike) -> dict:
    """config.json of a checkpoint directory; ValueError when it is missing or not a Hugging Face one."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise ValueError(f"{path} is not a Hugging Face checkpoint: {CONFIG_FILE} is missing")
    config = json.loads(file.read_text())
    if not is_hf_config(config):
        raise ValueError(f"{path}: {CONFIG_FILE} has no model_type (a dsrecipes-layout export: load it with "
                         "dsrecipes.models.load_exported or checkpoint=, not model=hf)")
    return config


def model_config_from_dir(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig of a Hugging Face checkpoint directory (or hub name), named after the directory.

    Cached per directory and config.json version: the hf_model resolver asks once per field, and a
    warning (a sliding window capping max_seq_len) is given once.
    """
    directory = resolve_checkpoint_dir(path)
    config_file = directory / CONFIG_FILE
    stamp = config_file.stat().st_mtime_ns if config_file.exists() else None
    return dataclasses.replace(_model_config_of(str(path), str(directory), stamp))


@functools.lru_cache(maxsize=16)
def _model_config_of(path: str, directory: str, stamp) -> ModelConfig:
    return model_config_from_hf(read_hf_config(directory), source=path, name=Path(path).name)


def hf_model_field(path: str, key: str):
    """OmegaConf resolver `${hf_model:PATH,KEY}`: field KEY of model_config_from_dir(PATH) (conf/model/hf.yaml)."""
    if path in (None, "", "???"):  # OmegaConf hands a missing model.path over as None
        raise ValueError("model=hf needs model.path=DIR: a Hugging Face checkpoint directory (or a hub name owner/name)")
    value = getattr(model_config_from_dir(path), key)
    return value.value if hasattr(value, "value") else value


def hf_model_type_for(cfg: ModelConfig) -> str:
    """The HF layout a dsrecipes model is exported in: gpt2, or llama (qwen2 for biases on q/k/v only)."""
    if cfg.style == "gpt2":
        return "gpt2"
    return "qwen2" if cfg.attn_qkv_bias and not cfg.bias else "llama"


def hf_config_for(cfg: ModelConfig, bos_id: int | None, eos_id: int | None) -> dict:
    """config.json of a dsrecipes model in the HF layout hf_model_type_for(cfg) names (float32 weights)."""
    model_type = hf_model_type_for(cfg)
    common = {"model_type": model_type, "architectures": [ARCHITECTURES[model_type]], "vocab_size": cfg.vocab_size,
              "initializer_range": cfg.init_std, "tie_word_embeddings": cfg.tie_embeddings,
              "bos_token_id": bos_id, "eos_token_id": eos_id, "dtype": "float32", "use_cache": True}
    if model_type == "gpt2":
        return {**common, "n_positions": cfg.max_seq_len, "n_embd": cfg.d_model, "n_layer": cfg.n_layer,
                "n_head": cfg.n_head, "n_inner": cfg.ffn_dim, "activation_function": "gelu_new",
                "layer_norm_epsilon": cfg.norm_eps, "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout,
                "attn_pdrop": cfg.dropout, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False}
    fields = {**common, "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_dim, "num_hidden_layers": cfg.n_layer,
              "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
              "hidden_act": "silu", "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
              "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
              "attention_dropout": cfg.dropout}
    if model_type == "qwen2":
        return {**fields, "use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layer}
    return {**fields, "attention_bias": cfg.bias or cfg.attn_qkv_bias, "mlp_bias": cfg.bias}


def register_hf_resolver() -> None:
    """Idempotent: the `${hf_model:PATH,KEY}` resolver conf/model/hf.yaml fills the model's fields with."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("hf_model"):
        OmegaConf.register_new_resolver("hf_model", hf_model_field, use_cache=True)
