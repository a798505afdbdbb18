"""The Hugging Face module itself as the recipe's model: model.style=hf, the transformers path.

    python -m dsrecipes model=hf model.path=DIR                # any causal LM transformers knows (auto picks this
                                                               # path where dsrecipes' blocks cannot compute it)
    module = build_hf_module(model_cfg)                        # HFCausalLM on the meta device (weights: hf_loading)
    out = module(input_ids, labels=labels)                     # GPTOutput: logits, mean CE over labels != -100
    module.hf                                                  # the transformers PreTrainedModel, its own names

Why a wrapper: dsrecipes' batches hold labels already shifted (labels[t] is the token after input_ids[t]), where a
transformers model shifts the labels it is given once more; the wrapper asks the module for logits only and takes
the same mean cross-entropy as dsrecipes' GPT (plus the router's auxiliary loss, weighted by the config's
router_aux_loss_coef, where an MoE config asks for it with output_router_logits, as transformers adds it). It also
passes the positions of a sequence chunk (Ulysses sequence parallelism) as position_ids, and answers the questions
the Trainer asks of its model (parameters, FLOPs per token, the decoder layers).

The module is built by `AutoModelForCausalLM.from_config` from the checkpoint's config.json with float32
parameters on the meta device and buffers (rotary frequencies, embedding scales) computed on the CPU as transformers
computes them; dsrecipes.models.hf_loading fills each rank's part of the parameters from the safetensors. Dropout
comes from model.dropout (every dropout probability of the config is set to it; default 0), as on the native path.
Attention runs through transformers' sdpa attention (or dsrecipes' Ulysses wrapper of it, registered by
dsrecipes.distributed.hf_sequence_parallel).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dsrecipes.models.config import ModelConfig
from dsrecipes.models.decoder_layers import decoder_layers
from dsrecipes.models.gpt import GPTOutput
from dsrecipes.models.hf_config import read_hf_config, resolve_checkpoint_dir

INSTALL_HINT = "pip install 'dsrecipes[hf]' (the hf extra: transformers)"
ATTENTION = "sdpa"  # transformers' attention function the module starts with (Ulysses wraps it)


def transformers_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def require_transformers(model_cfg: ModelConfig):
    """The transformers package; ValueError naming model.path and the extra when it is not installed."""
    if not transformers_available():
        raise ValueError(f"model.path={model_cfg.path!r} runs as the Hugging Face module itself (model.style=hf), "
                         f"which needs transformers: {INSTALL_HINT}")
    import transformers

    return transformers


def _dropout_keys(config) -> list[str]:
    return [key for key, value in config.to_dict().items() if isinstance(value, float)
            and ("dropout" in key or key.endswith("_pdrop"))]


@functools.lru_cache(maxsize=8)
def _auto_config(directory: str, trust_remote_code: bool, stamp):
    import transformers

    return transformers.AutoConfig.from_pretrained(directory, trust_remote_code=trust_remote_code)


def hf_config_of(model_cfg: ModelConfig):
    """transformers' config of model.path (AutoConfig), with model.dropout as every dropout probability and the
    attention implementation dsrecipes runs; a fresh copy per call."""
    require_transformers(model_cfg)
    directory = resolve_checkpoint_dir(model_cfg.path)
    stamp = (directory / "config.json").stat().st_mtime_ns
    config = _auto_config(str(directory), bool(model_cfg.trust_remote_code), stamp)
    config = type(config).from_dict(config.to_dict())
    for key in _dropout_keys(config):
        setattr(config, key, float(model_cfg.dropout))
    config._attn_implementation = ATTENTION
    config.use_cache = False
    return config


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside register their parameters on the meta device and keep their buffers where they are
    computed (the CPU): what Accelerate's init_empty_weights(include_buffers=False) does. Non-persistent buffers
    (rotary frequencies) are not in a checkpoint, so they must be computed, not loaded."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def build_hf_module(model_cfg: ModelConfig) -> HFCausalLM:
    """HFCausalLM around AutoModelForCausalLM.from_config(model.path's config), float32 parameters on meta."""
    transformers = require_transformers(model_cfg)
    config = hf_config_of(model_cfg)
    with parameters_on_meta():
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, trust_remote_code=bool(model_cfg.trust_remote_code))
    return HFCausalLM(model, model_cfg)


def _experts_per_token(config) -> tuple[int, int] | None:
    """(k, experts) of an MoE config, None for a dense one."""
    k = getattr(config, "num_experts_per_tok", None)
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    return (int(k), int(experts)) if k and experts else None


class HFCausalLM(nn.Module):
    """A transformers causal LM with dsrecipes' model interface (see the module docstring)."""

    def __init__(self, hf: nn.Module, cfg: ModelConfig):
        super().__init__()
        self.hf = hf
        self.cfg = cfg

    @property
    def layers(self) -> list[nn.Module]:
        """The decoder layers (the model class's _no_split_modules)."""
        return decoder_layers(self.hf)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                position_offset: int = 0, position_ids: torch.Tensor | None = None) -> GPTOutput:
        """input_ids, labels: [batch, seq]; labels[t] is the target of position t (already shifted); the loss is the
        mean cross-entropy over labels != -100. position_offset: the position of input_ids' first token.
        position_ids: the positions of rows of packed documents (restarting at 0 with each): transformers then
        gives each document its own causal block (its packed-sequence masks, masking_utils)."""
        kwargs = {}
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        elif position_offset:
            seq = input_ids.shape[1]
            positions = torch.arange(position_offset, position_offset + seq, device=input_ids.device)
            kwargs["position_ids"] = positions.unsqueeze(0).expand(input_ids.shape[0], seq)
        out = self.hf(input_ids=input_ids, use_cache=False, **kwargs)
        logits, loss = out.logits, None
        if labels is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
            aux = getattr(out, "aux_loss", None)
            if aux is not None:  # an MoE router's balance loss, weighted as transformers weights it
                loss = loss + getattr(self.hf.config, "router_aux_loss_coef", 0.0) * aux.to(loss.device)
        return GPTOutput(logits=logits, loss=loss)

    def _embedding_params(self) -> int:
        embeddings = [m for m in self.hf.modules() if isinstance(m, nn.Embedding)]
        head = self.hf.get_output_embeddings() if hasattr(self.hf, "get_output_embeddings") else None
        tied = head is not None and any(head.weight is e.weight for e in embeddings)
        # the token embedding is the LM head's matmul weight when tied; position tables are lookups only
        return sum(e.weight.numel() for e in embeddings) - (head.weight.numel() if tied else 0)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (a tied weight counts once); non_embedding drops the lookup-only tables."""
        total = sum(p.numel() for p in self.parameters())
        return total - self._embedding_params() if non_embedding else total

    def num_active_params(self, non_embedding: bool = False) -> int:
        """Parameters one token computes with: an MoE layer's experts count k/E of their size."""
        total = self.num_params(non_embedding)
        moe = _experts_per_token(self.hf.config)
        if moe is None:
            return total
        k, experts = moe
        expert_params = sum(p.numel() for name, p in self.named_parameters() if ".experts." in f".{name}.")
        return total - expert_params + expert_params * k // experts

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token: 6N (N = active non-embedding parameters) + 12*L*d*T (attention scores)."""
        seq_len = seq_len or self.cfg.max_seq_len
        width = self.cfg.n_head * self.cfg.head_dim
        return 6.0 * self.num_active_params(non_embedding=True) + 12.0 * self.cfg.n_layer * width * seq_len

    def describe(self) -> str:
        """The layout line's model part."""
        layers = self.layers
        unit = type(layers[0]).__name__ if layers else "module"
        return (f"transformers {type(self.hf).__name__} ({self.hf.config.model_type}; {len(layers)} x {unit}, "
                f"attention {self.hf.config._attn_implementation})")


def checkpoint_directory(model_cfg: ModelConfig) -> Path:
    """model.path as a local directory (a hub name's snapshot)."""
    return resolve_checkpoint_dir(model_cfg.path)


def checkpoint_config(model_cfg: ModelConfig) -> dict:
    """model.path's config.json."""
    return read_hf_config(checkpoint_directory(model_cfg))
