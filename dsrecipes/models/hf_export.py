"""Export a dsrecipes GPT in the Hugging Face layout, loadable by transformers and by dsrecipes alike.

    export_model(model.state_dict(), cfg, "exported/", tokenizer="byte")
    AutoModelForCausalLM.from_pretrained("exported/")     # same logits as the dsrecipes model
    dsrecipes.models.load_exported("exported/")            # the dsrecipes GPT back, exactly

    <dir>/config.json             HF config (model_type gpt2 | llama | qwen2, architectures, shape, eps, rope_theta,
                                  tie_word_embeddings, bos/eos ids) + "dsrecipes": {"model": ModelConfig fields,
                                  "tokenizer": "byte" | "tokenizer.json", extra (sparse_attention, source, ...)}
    <dir>/model.safetensors       float32 weights under HF names (a tied LM head stored once, as the embedding)
    <dir>/generation_config.json  bos / eos / pad ids
    <dir>/tokenizer.json (+ tokenizer_config.json ...)   the tokenizer, copied in (dsrecipes.models.hf_tokenizer)

Which HF architecture: gpt2-style -> GPT2LMHeadModel; llama-style -> LlamaForCausalLM (Qwen2ForCausalLM
for biases on q/k/v only). An MoE model (or a state dict with tensors a dense GPT does not have) has
no such layout here and is written in dsrecipes' own (dsrecipes.models.export.export_safetensors),
its tokenizer copied in the same way.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from safetensors.torch import save_file

from dsrecipes.models.config import ModelConfig
from dsrecipes.models.export import CONFIG_FILE, WEIGHTS_FILE, export_safetensors
from dsrecipes.models.hf_config import DSRECIPES_KEY, hf_config_for
from dsrecipes.models.hf_tokenizer import write_tokenizer_files
from dsrecipes.models.hf_weights import NoHFLayout, to_hf_state
from dsrecipes.models.moe_config import MoEConfig

GENERATION_CONFIG = "generation_config.json"
log = logging.getLogger("dsrecipes")


def export_hf(state: dict, model_cfg: ModelConfig, out_dir: str | Path, tokenizer: str = "byte",
              extra: dict | None = None) -> Path:
    """Write the HF layout of the module docstring; returns the weights file."""
    out_dir = Path(out_dir)
    hf_state = to_hf_state(state, model_cfg)  # before anything is written: a model it cannot name fails cleanly
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer_files(tokenizer, out_dir, model_cfg.max_seq_len)
    config = hf_config_for(model_cfg, tok["bos_token_id"], tok["eos_token_id"])
    recorded = {**dataclasses.asdict(model_cfg), "path": None}  # the weights are here now
    config[DSRECIPES_KEY] = {"model": recorded, **(extra or {}), "tokenizer": tok["tokenizer"]}
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": tok["bos_token_id"], "eos_token_id": tok["eos_token_id"],
                  "pad_token_id": tok["eos_token_id"], "_from_model_config": False}
    (out_dir / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2))
    weights = out_dir / WEIGHTS_FILE
    save_file(hf_state, str(weights), metadata={"format": "pt"})
    return weights


def export_model(state: dict, model_cfg: ModelConfig, out_dir: str | Path, tokenizer: str = "byte",
                 extra: dict | None = None, moe_cfg: MoEConfig | None = None) -> Path:
    """The Trainer's and `python -m dsrecipes.export`'s export: the HF layout; dsrecipes' own for MoE models and
    any state dict that is not a dense GPT of `model_cfg` (said in the log)."""
    if moe_cfg is None or not moe_cfg.enabled:
        try:
            return export_hf(state, model_cfg, out_dir, tokenizer, extra)
        except NoHFLayout as why:
            log.warning("export: no Hugging Face layout (%s); writing dsrecipes' layout to %s", why, out_dir)
    else:
        log.info("export: an MoE model has no Hugging Face layout here; writing dsrecipes' layout to %s", out_dir)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer_files(tokenizer, out_dir, model_cfg.max_seq_len)
    return export_safetensors(state, model_cfg, out_dir, extra={**(extra or {}), "tokenizer": tok["tokenizer"]},
                              moe_cfg=moe_cfg)
