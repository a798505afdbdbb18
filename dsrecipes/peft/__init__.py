"""Parameter-efficient fine-tuning (LoRA) for dsrecipes models and transformers modules, in plain PyTorch.

    from dsrecipes.peft import PeftConfig, apply_lora, lora_state_dict, merged_state_dict, write_peft_adapter

    cfg = PeftConfig(method="lora", r=8, alpha=16)
    wrapped = apply_lora(model, cfg)            # adapters on the selected nn.Linear, everything else frozen
    merged = merged_state_dict(model)           # the plain model's state dict, adapters folded in
    write_peft_adapter(lora_state_dict(model), cfg, "adapter/", "base-dir")   # PeftModel.from_pretrained reads it

No Hydra here (the config is a plain dataclass) and no dependency on the `peft` package: the adapter files are
written in its format (dsrecipes.peft.peft_export).
"""

from dsrecipes.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "DEFAULT_TARGET_MODULES": "dsrecipes.peft.config",
    "PeftConfig": "dsrecipes.peft.config",
    "validate_peft_config": "dsrecipes.peft.config",
    "LoRALinear": "dsrecipes.peft.lora",
    "add_base_layer_names": "dsrecipes.peft.lora",
    "apply_lora": "dsrecipes.peft.lora",
    "count_trainable": "dsrecipes.peft.lora",
    "init_lora": "dsrecipes.peft.lora",
    "lora_modules": "dsrecipes.peft.lora",
    "lora_state_dict": "dsrecipes.peft.lora",
    "lora_state_dict_of": "dsrecipes.peft.lora",
    "merge_lora_state": "dsrecipes.peft.lora",
    "merged_state_dict": "dsrecipes.peft.lora",
    "strip_base_layer_names": "dsrecipes.peft.lora",
    "hf_module_adapter_state": "dsrecipes.peft.peft_export",
    "native_llama_adapter_state": "dsrecipes.peft.peft_export",
    "native_name_map": "dsrecipes.peft.peft_export",
    "write_peft_adapter": "dsrecipes.peft.peft_export",
}

__all__ = sorted(_EXPORTS)

# Lazy: the recipe schema imports dsrecipes.peft.config, and composing a recipe (--help, --cfg) must not import torch.
__getattr__ = lazy_exports(__name__, _EXPORTS)
