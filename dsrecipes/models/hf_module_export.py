"""Export of a transformers-path model (model.style=hf): a `save_pretrained` directory of its own architecture.

    export_transformers(engine.module_state_dict(), model_cfg, "export/", tokenizer="PATH/tokenizer.json")
    AutoModelForCausalLM.from_pretrained("export/")      # the trained weights, the same logits

The gathered state dict (the wrapper's `hf.` names) is put into a module built from model.path's own config.json
(its dropout and attention settings as the user saved them, not the training run's), which transformers then writes
in its own layout (safetensors; an MoE model's experts back in the checkpoint's per-expert names) with its
generation config. The tokenizer is copied in beside it (dsrecipes.models.hf_tokenizer), so the directory is the
input of `model=hf model.path=export/` and of `mode=generate checkpoint=export/` again.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dsrecipes.models.config import ModelConfig
from dsrecipes.models.hf_loading import HF_PREFIX
from dsrecipes.models.hf_tokenizer import write_tokenizer_files


def export_transformers(state: dict, model_cfg: ModelConfig, out_dir: str | Path, tokenizer: str = "byte") -> Path:
    """Write the save_pretrained directory of the module docstring; returns it."""
    import transformers

    from dsrecipes.models.hf_config import resolve_checkpoint_dir
    from dsrecipes.models.hf_module import _auto_config, parameters_on_meta

    out_dir = Path(out_dir)
    directory = resolve_checkpoint_dir(model_cfg.path)
    config = _auto_config(str(directory), bool(model_cfg.trust_remote_code),
                          (directory / "config.json").stat().st_mtime_ns)
    with parameters_on_meta():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                              trust_remote_code=bool(model_cfg.trust_remote_code))
    hf_state = {name.removeprefix(HF_PREFIX): tensor.detach().to("cpu", torch.float32)
                for name, tensor in state.items()}
    model.load_state_dict(hf_state, strict=False, assign=True)
    model.tie_weights()
    still_meta = [name for name, p in model.named_parameters() if p.is_meta]
    if still_meta:
        raise ValueError(f"export: the trained state has no {still_meta[0]!r} ({len(still_meta)} tensors missing)")
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    write_tokenizer_files(tokenizer, out_dir, model_cfg.max_seq_len)
    return out_dir
