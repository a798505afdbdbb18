"""A Hugging Face model inside a module, and its repeated layers: the units sharding, checkpointing and compiling take.

    layers = decoder_layers(model)      # [LlamaDecoderLayer, ...] of an HF model (or of a wrapper around one); [] else
    hf = transformers_model(module)     # the PreTrainedModel itself (module, or module.hf), None for other modules
    config = text_config(hf)            # its text model's config (a multimodal config's text part)

transformers names them on each model class: `_no_split_modules`, the classes that must not be split across devices
(Accelerate's and DeepSpeed's unit of placement). FSDP2 shards each such layer as one unit, activation checkpointing
recomputes each, compile=blocks compiles each (dsrecipes.distributed.data_parallel.fsdp2, activation_checkpoint,
torch_compile); a model without such a list (dsrecipes' GPT, a plain module) keeps their nn.ModuleList rule. No
transformers import: the attribute is read from the modules.
"""

from __future__ import annotations

from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The outermost modules of `model` whose class is named in a `_no_split_modules` of a module in it, in order."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    if not names:
        return []
    layers, inside = [], []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside):
            continue
        if type(module).__name__ in names:
            layers.append(module)
            inside.append(name)
    return layers


def transformers_model(module: nn.Module) -> nn.Module | None:
    """The transformers PreTrainedModel `module` is, or wraps as `.hf` (dsrecipes.models.hf_module.HFCausalLM);
    None for any other module. Duck-typed (a config and a base_model_prefix), so transformers need not be imported."""
    for candidate in (module, getattr(module, "hf", None)):
        if isinstance(candidate, nn.Module) and hasattr(candidate, "config") and hasattr(candidate, "base_model_prefix"):
            return candidate
    return None


def text_config(hf_model: nn.Module):
    """The config of `hf_model`'s text decoder: get_text_config() where the config has one (multimodal models nest
    it), else the config itself. Heads, windows and soft-capping are read from it."""
    config = hf_model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config
