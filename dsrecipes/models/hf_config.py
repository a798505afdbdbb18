"""Hugging Face config.json <-> ModelConfig: which way a checkpoint runs, and the shape it runs with.

    cfg = model_config_from_hf(json.loads(Path("DIR/config.json").read_text()), source="DIR")
    cfg.style            # "gpt2" / "llama": dsrecipes' own blocks (native); "hf": the transformers module itself
    hf = hf_config_for(cfg, bos_id=256, eos_id=256)     # {"model_type": "qwen3", "architectures": [...], ...}
    cfg = model_config_from_dir("DIR")                   # what `model=hf model.path=DIR` composes

Two ways to run a checkpoint (model.impl):
* native: dsrecipes' GPT, where the architecture maps onto its blocks exactly. gpt2 -> style gpt2
  (LayerNorm, tanh GELU = HF's "gelu_new", learned positions, biases); llama, mistral, qwen2 and qwen3 ->
  style llama (RMSNorm, SwiGLU, rotary embeddings: dsrecipes rotates the halves (x[:d/2], x[d/2:]) of each
  head, which is HF Llama's rotate_half layout, so q/k weights map unpermuted; grouped-query attention; an
  explicit head_dim; Qwen3's per-head q/k norms; Llama 3.1's llama3 and linear rope scaling).
* transformers: every other architecture transformers knows (and a mappable one with model.impl=transformers):
  style hf, the module AutoModelForCausalLM builds (dsrecipes.models.hf_module). Its ModelConfig carries the
  shape fields the recipe's checks read (layers, heads, width, vocabulary, context length).
`auto` (the default) takes native where `native_fields` accepts the config and says why not otherwise
(`native_refusal`); model.impl=native on a config it refuses is an error naming the key.

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
NATIVE_MODEL_TYPES = ("gpt2", "llama", "mistral", "qwen2", "qwen3")
SUPPORTED_MODEL_TYPES = NATIVE_MODEL_TYPES  # the model_types dsrecipes' own blocks take (the others: transformers)
IMPLS = ("auto", "native", "transformers")
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")  # both are the tanh approximation dsrecipes computes
NATIVE_ROPE_TYPES = ("default", "linear", "llama3")
# Fields whose HF value must agree with the "dsrecipes" record for the record to be used.
_AGREEING = ("n_layer", "d_model", "vocab_size", "max_seq_len", "norm_eps", "tie_embeddings")


class NotNative(ValueError):
    """A config.json whose architecture dsrecipes' blocks cannot compute exactly (the message says why)."""


def is_hf_config(config: dict) -> bool:
    """A Hugging Face config.json (it has a model_type), as opposed to dsrecipes' own export layout."""
    return isinstance(config, dict) and "model_type" in config


def model_type_of(config: dict, source: str) -> str:
    """config.json's model_type; ValueError when it has none."""
    model_type = config.get("model_type")
    if not model_type:
        raise ValueError(f"{source}: config.json has no model_type (is it a Hugging Face checkpoint?)")
    return model_type


def _refuse(key: str, value, why: str) -> None:
    raise NotNative(f"config.json has {key}={value!r}, which dsrecipes' blocks cannot compute ({why})")


def _rope(config: dict) -> dict:
    """The rotary fields from transformers 5's rope_parameters or 4.x's rope_theta / rope_scaling."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    merged = {**scaling, **params}
    rope_type = merged.get("rope_type") or merged.get("type") or "default"
    if rope_type not in NATIVE_ROPE_TYPES:
        _refuse("rope_type", rope_type, f"dsrecipes' rotary embeddings are {', '.join(NATIVE_ROPE_TYPES)}")
    fields = {"rope_theta": float(merged.get("rope_theta") or config.get("rope_theta") or 10000.0),
              "rope_type": rope_type}
    if rope_type != "default":
        fields["rope_factor"] = float(merged.get("factor", 1.0))
    if rope_type == "llama3":
        fields.update(rope_low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
                      rope_high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
                      rope_original_max_seq_len=int(merged.get("original_max_position_embeddings")
                                                    or config.get("max_position_embeddings", 2048)))
    return fields


def _sliding_window(config: dict, model_type: str) -> int | None:
    """The attention window of a Mistral / Qwen2 / Qwen3 checkpoint, or None where every layer attends to all tokens."""
    window = config.get("sliding_window")
    if model_type in ("qwen2", "qwen3"):
        sliding_layers = "sliding_attention" in (config.get("layer_types") or [])
        return window if window and (config.get("use_sliding_window") or sliding_layers) else None
    return window if model_type == "mistral" else None


def _gpt2_fields(config: dict) -> dict:
    activation = config.get("activation_function", "gelu_new")
    if activation not in GPT2_ACTIVATIONS:
        _refuse("activation_function", activation, f"dsrecipes' GELU is the tanh one: {', '.join(GPT2_ACTIVATIONS)}")
    if config.get("scale_attn_by_inverse_layer_idx"):
        _refuse("scale_attn_by_inverse_layer_idx", True, "attention scores are scaled by 1/sqrt(head_dim) only")
    if not config.get("scale_attn_weights", True):
        _refuse("scale_attn_weights", False, "attention scores are always scaled by 1/sqrt(head_dim)")
    if config.get("add_cross_attention"):
        _refuse("add_cross_attention", True, "decoder-only blocks have no cross-attention")
    d_model = config["n_embd"]
    return dict(style="gpt2", n_layer=config["n_layer"], n_head=config["n_head"], d_model=d_model,
                d_ff=config.get("n_inner") or 4 * d_model, vocab_size=config["vocab_size"],
                max_seq_len=config["n_positions"], bias=True, norm_eps=config.get("layer_norm_epsilon", 1e-5),
                tie_embeddings=config.get("tie_word_embeddings", True))


def _llama_fields(config: dict, model_type: str, source: str) -> dict:
    if config.get("hidden_act", "silu") != "silu":
        _refuse("hidden_act", config["hidden_act"], "the SwiGLU MLP uses silu")
    if config.get("mlp_only_layers") or config.get("num_experts") or config.get("num_local_experts"):
        _refuse("num_experts", config.get("num_experts") or config.get("num_local_experts"),
                "a Hugging Face mixture of experts trains as the transformers module")
    d_model, n_head = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim")
    n_kv = config.get("num_key_value_heads") or n_head
    if model_type == "qwen2":  # q/k/v projections with biases, none elsewhere
        bias, qkv_bias = False, True
    elif model_type in ("llama", "qwen3"):  # attention_bias covers q/k/v/o, mlp_bias the MLP; a missing one loads as 0
        bias = bool(config.get("attention_bias") or config.get("mlp_bias"))
        qkv_bias = None if bias == bool(config.get("attention_bias")) else bool(config.get("attention_bias"))
    else:
        bias, qkv_bias = False, None
    max_seq_len = config.get("max_position_embeddings", 2048)
    window = _sliding_window(config, model_type)
    if window and window < max_seq_len:
        warnings.warn(f"{source}: sliding_window={window} < max_position_embeddings={max_seq_len}; dsrecipes attends "
                      f"to every earlier token, which equals the window up to {window} tokens: model.max_seq_len={window}",
                      stacklevel=4)
        max_seq_len = window
    rope = _rope(config)
    return dict(style="llama", n_layer=config["num_hidden_layers"], n_head=n_head, n_kv_head=None if n_kv == n_head else n_kv,
                d_model=d_model, d_ff=config["intermediate_size"], vocab_size=config["vocab_size"], max_seq_len=max_seq_len,
                bias=bias, qkv_bias=qkv_bias, norm_eps=config.get("rms_norm_eps", 1e-6),
                tie_embeddings=config.get("tie_word_embeddings", False),
                d_head=head_dim if head_dim not in (None, d_model // n_head) else None,
                qk_norm=model_type == "qwen3", **rope)


def native_fields(config: dict, source: str = "config.json") -> dict:
    """The ModelConfig fields of dsrecipes' blocks for this config.json; NotNative saying why they cannot compute it."""
    model_type = model_type_of(config, source)
    if model_type not in NATIVE_MODEL_TYPES:
        raise NotNative(f"model_type {model_type!r} has no native form (dsrecipes' blocks take "
                        f"{', '.join(NATIVE_MODEL_TYPES)})")
    if config.get("auto_map"):
        raise NotNative("config.json names its own modelling code (auto_map)")
    return _gpt2_fields(config) if model_type == "gpt2" else _llama_fields(config, model_type, source)


def native_refusal(config: dict, source: str = "config.json") -> str | None:
    """Why this config.json cannot run on dsrecipes' blocks, or None when it can."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            native_fields(config, source)
    except NotNative as why:
        return str(why)
    return None


def text_config(config: dict) -> dict:
    """The language model's part of a config.json: its text_config where it nests one (multimodal configs)."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) and "num_hidden_layers" not in config else config


def _first(config: dict, *names, default=None):
    return next((config[n] for n in names if config.get(n) is not None), default)


def transformers_fields(config: dict, source: str = "config.json") -> dict:
    """The shape fields of a transformers-path model (style hf): what the recipe's checks and the estimator read.
    The module itself is built by transformers from the whole config.json."""
    text = text_config(config)
    n_head = _first(text, "num_attention_heads", "n_head", "num_heads")
    d_model = _first(text, "hidden_size", "n_embd", "d_model")
    n_layer = _first(text, "num_hidden_layers", "n_layer", "num_layers")
    vocab = _first(text, "vocab_size")
    missing = [k for k, v in (("num_hidden_layers", n_layer), ("num_attention_heads", n_head), ("hidden_size", d_model),
                              ("vocab_size", vocab)) if v is None]
    if missing:
        raise ValueError(f"{source}: config.json has no {', '.join(missing)} (dsrecipes reads the shape of a causal LM "
                         "from them)")
    n_kv = _first(text, "num_key_value_heads", "num_kv_heads", default=1 if text.get("multi_query") else n_head)
    head_dim = _first(text, "head_dim")
    return dict(style="hf", n_layer=n_layer, n_head=n_head, n_kv_head=None if n_kv == n_head else n_kv,
                d_model=d_model, d_ff=_first(text, "intermediate_size", "n_inner", "ffn_dim"), vocab_size=vocab,
                max_seq_len=_first(text, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length",
                                   default=2048),
                bias=False, norm_eps=float(_first(text, "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
                                                  "norm_eps", default=1e-5)),
                tie_embeddings=bool(_first(config, "tie_word_embeddings", default=True)),
                d_head=head_dim if head_dim not in (None, d_model // n_head) else None)


def model_config_from_hf(config: dict, source: str = "config.json", name: str | None = None,
                         impl: str = "auto") -> ModelConfig:
    """The ModelConfig of a Hugging Face config.json as model.impl chooses (dsrecipes' own record when it agrees)."""
    impl = str(impl)
    if impl not in IMPLS:
        raise ValueError(f"model.impl={impl!r} is not valid; choose one of: {', '.join(IMPLS)}")
    model_type = model_type_of(config, source)
    fields = None
    if impl != "transformers":
        try:
            fields = native_fields(config, source)
        except NotNative as why:
            if impl == "native":
                raise ValueError(f"model.impl=native: {source}: {why}; model.impl=auto (or transformers) runs it as "
                                 "the Hugging Face module") from None
    if fields is None:
        fields = transformers_fields(config, source)
    cfg = ModelConfig(name=name or model_type, init_std=config.get("initializer_range", 0.02), **fields)
    own = config.get(DSRECIPES_KEY, {}).get("model")
    if own and cfg.style != "hf":
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        recorded = ModelConfig(**{k: v for k, v in own.items() if k in known})
        if all(getattr(recorded, k) == getattr(cfg, k) for k in _AGREEING) and recorded.ffn_dim == cfg.ffn_dim \
                and recorded.style == cfg.style and recorded.n_head == cfg.n_head:
            cfg = recorded
        else:
            warnings.warn(f"{source}: its {DSRECIPES_KEY!r} record does not match the Hugging Face fields (saved again "
                          "by transformers after a change?); the Hugging Face fields are used", stacklevel=2)
    if cfg.style == "hf":
        cfg.path = str(source)
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


def model_config_from_dir(path: str | os.PathLike, impl: str = "auto") -> ModelConfig:
    """The ModelConfig of a Hugging Face checkpoint directory (or hub name), named after the directory.

    Cached per directory, config.json version and impl: the hf_model resolver asks once per field, and a
    warning (a sliding window capping max_seq_len) is given once.
    """
    directory = resolve_checkpoint_dir(path)
    config_file = directory / CONFIG_FILE
    stamp = config_file.stat().st_mtime_ns if config_file.exists() else None
    return dataclasses.replace(_model_config_of(str(path), str(directory), stamp, str(impl)))


@functools.lru_cache(maxsize=16)
def _model_config_of(path: str, directory: str, stamp, impl: str) -> ModelConfig:
    return model_config_from_hf(read_hf_config(directory), source=path, name=Path(path).name, impl=impl)


def hf_model_field(path: str, key: str, impl: str = "auto"):
    """OmegaConf resolver `${hf_model:PATH,KEY,IMPL}`: field KEY of model_config_from_dir(PATH, IMPL)
    (conf/model/hf.yaml)."""
    if path in (None, "", "???"):  # OmegaConf hands a missing model.path over as None
        raise ValueError("model=hf needs model.path=DIR: a Hugging Face checkpoint directory (or a hub name owner/name)")
    value = getattr(model_config_from_dir(path, impl), key)
    return value.value if hasattr(value, "value") else value


def hf_model_type_for(cfg: ModelConfig) -> str:
    """The HF layout a dsrecipes model is exported in: gpt2, or llama (qwen2 for biases on q/k/v only, qwen3 with
    per-head q/k norms)."""
    if cfg.style == "gpt2":
        return "gpt2"
    if cfg.qk_norm:
        return "qwen3"
    return "qwen2" if cfg.attn_qkv_bias and not cfg.bias else "llama"


def _rope_parameters(cfg: ModelConfig) -> dict:
    params = {"rope_type": str(cfg.rope_type), "rope_theta": cfg.rope_theta}
    if params["rope_type"] != "default":
        params["factor"] = cfg.rope_factor
    if params["rope_type"] == "llama3":
        params.update(low_freq_factor=cfg.rope_low_freq_factor, high_freq_factor=cfg.rope_high_freq_factor,
                      original_max_position_embeddings=cfg.rope_original_max_seq_len or cfg.max_seq_len)
    return params


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
    rope = _rope_parameters(cfg)
    fields = {**common, "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_dim, "num_hidden_layers": cfg.n_layer,
              "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
              "hidden_act": "silu", "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
              "rope_theta": cfg.rope_theta, "rope_parameters": rope, "attention_dropout": cfg.dropout}
    if rope["rope_type"] != "default":  # transformers 4.x reads the scaling from rope_scaling
        fields["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    if model_type == "qwen2":
        return {**fields, "use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layer}
    if model_type == "qwen3":
        return {**fields, "attention_bias": cfg.bias or cfg.attn_qkv_bias, "use_sliding_window": False,
                "sliding_window": None, "max_window_layers": cfg.n_layer}
    return {**fields, "attention_bias": cfg.bias or cfg.attn_qkv_bias, "mlp_bias": cfg.bias}


def register_hf_resolver() -> None:
    """Idempotent: the `${hf_model:PATH,KEY,IMPL}` resolver conf/model/hf.yaml fills the model's fields with."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("hf_model"):
        OmegaConf.register_new_resolver("hf_model", hf_model_field, use_cache=True)
