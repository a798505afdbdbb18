"""A LoRA run's export: the merged model where the plain export goes, the PEFT adapter beside it.

    merged = export_lora_adapter(state, cfg, out_dir)   # state: the full model state (engine.module_state_dict())

<out>/ holds the model with every adapter folded in (W + B @ A * alpha / r: the usual export of its kind, so
transformers and dsrecipes load it as any fine-tuned model); <out>/adapter/ holds adapter_config.json and
adapter_model.safetensors, which `peft.PeftModel.from_pretrained(base, "<out>/adapter")` loads onto the base
checkpoint (model.path). A model trained from scratch has no base checkpoint to put an adapter on, and a gpt2-style
native model's fused attention has no PEFT layout here: only the merged export is written for those (one log line
says so).
"""

from __future__ import annotations

import logging
from pathlib import Path

from dsrecipes.peft import lora_state_dict_of, merge_lora_state, native_name_map, write_peft_adapter

log = logging.getLogger("dsrecipes")
ADAPTER_DIR = "adapter"


def export_lora_adapter(state: dict, cfg, out_dir: str | Path) -> dict:
    """Write <out_dir>/adapter/ where the model has a base checkpoint and a PEFT layout; return the merged state."""
    peft, model_cfg = cfg.peft, cfg.model
    if str(peft.quantize_base) != "none":  # QLoRA-style: the base's codes back to float weights first
        from dsrecipes.peft.quantized_base import dequantized_state

        state = dequantized_state(state)
    merged = merge_lora_state(state, peft.scaling)
    adapter = lora_state_dict_of(state, peft.bias)
    if not model_cfg.path:
        log.info("export: LoRA merged into the model; no adapter/ (trained from scratch: no base checkpoint for it)")
        return merged
    try:
        name_map = None if model_cfg.runs_transformers else native_name_map(model_cfg)
    except ValueError as why:
        log.info("export: LoRA merged into the model; no adapter/ (%s)", why)
        return merged
    directory = write_peft_adapter(adapter, peft, Path(out_dir) / ADAPTER_DIR, str(model_cfg.path), name_map=name_map)
    log.info("export: LoRA adapter in PEFT's format at %s (base: %s)", directory, model_cfg.path)
    return merged
