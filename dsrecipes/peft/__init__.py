"""Parameter-efficient fine-tuning (LoRA) for dsrecipes models and transformers modules, in plain PyTorch.

    from dsrecipes.peft import PeftConfig, apply_lora, lora_state_dict, merged_state_dict, write_peft_adapter

    cfg = PeftConfig(method="lora", r=8, alpha=16)
    wrapped = apply_lora(model, cfg)            # adapters on the selected nn.Linear, everything else frozen
    merged = merged_state_dict(model)           # the plain model's state dict, adapters folded in
    write_peft_adapter(lora_state_dict(model), cfg, "adapter/", "base-dir")   # PeftModel.from_pretrained reads it

No Hydra here (the config is a plain dataclass) and no dependency on the `peft` package: the adapter files are
written in its format (dsrecipes.peft.peft_export).
"""

from dsrecipes.peft.config import DEFAULT_TARGET_MODULES, PeftConfig, validate_peft_config
from dsrecipes.peft.lora import (
    LoRALinear,
    add_base_layer_names,
    apply_lora,
    count_trainable,
    init_lora,
    lora_modules,
    lora_state_dict,
    lora_state_dict_of,
    merge_lora_state,
    merged_state_dict,
    strip_base_layer_names,
)
from dsrecipes.peft.peft_export import (
    hf_module_adapter_state,
    native_llama_adapter_state,
    native_name_map,
    write_peft_adapter,
)

__all__ = [
    "DEFAULT_TARGET_MODULES", "LoRALinear", "PeftConfig", "add_base_layer_names", "apply_lora", "count_trainable",
    "hf_module_adapter_state", "init_lora", "lora_modules", "lora_state_dict", "lora_state_dict_of",
    "merge_lora_state",
    "merged_state_dict", "native_llama_adapter_state", "native_name_map", "strip_base_layer_names",
    "validate_peft_config", "write_peft_adapter",
]
