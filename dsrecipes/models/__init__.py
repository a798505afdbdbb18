"""The GPT model family (GPT-2 and Llama style blocks) and its named flavors."""

from dsrecipes.models.config import MODEL_STYLES, ModelConfig, validate_model_config
from dsrecipes.models.export import export_safetensors, load_exported
from dsrecipes.models.flavors import available_flavors, load_flavor
from dsrecipes.models.gpt import GPT, GPTOutput

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
