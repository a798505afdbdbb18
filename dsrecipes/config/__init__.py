"""Configuration layer: the RootConfig schema, ConfigStore registration, loading and validation.

The only place (with the CLI) that imports Hydra.
"""

from dsrecipes.config.loading import load_config
from dsrecipes.config.schema import CONFIG_GROUPS, RootConfig
from dsrecipes.config.validate import validate_recipe

__all__ = ["CONFIG_GROUPS", "RootConfig", "load_config", "validate_recipe"]
