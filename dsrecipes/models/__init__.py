"""The GPT model family (GPT-2 and Llama style blocks) and its named flavors."""

from dsrecipes.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "MODEL_STYLES": "dsrecipes.models.config",
    "ModelConfig": "dsrecipes.models.config",
    "validate_model_config": "dsrecipes.models.config",
    "export_safetensors": "dsrecipes.models.export",
    "load_exported": "dsrecipes.models.export",
    "available_flavors": "dsrecipes.models.flavors",
    "load_flavor": "dsrecipes.models.flavors",
    "GPT": "dsrecipes.models.gpt",
    "GPTOutput": "dsrecipes.models.gpt",
}

__all__ = [
    "GPT",
    "GPTOutput",
    "MODEL_STYLES",
    "ModelConfig",
    "available_flavors",
    "export_safetensors",
    "load_exported",
    "load_flavor",
    "validate_model_config",
]


# Lazy, so that importing the package's schemas (models.config, moe_config, kernels_config) or the hf_model
# resolver (hf_config) does not import torch: `python -m dsrecipes --help` composes the recipe only.
__getattr__ = lazy_exports(__name__, _EXPORTS)
