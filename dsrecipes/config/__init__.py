"""Configuration layer: the RootConfig schema, ConfigStore registration, loading and validation.

The only place (with the CLI) that imports Hydra.
"""

from dsrecipes.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "load_config": "dsrecipes.config.loading",
    "CONFIG_GROUPS": "dsrecipes.config.schema",
    "RootConfig": "dsrecipes.config.schema",
    "validate_recipe": "dsrecipes.config.validate",
}

__all__ = ["CONFIG_GROUPS", "RootConfig", "load_config", "validate_recipe"]


# Lazy, so that importing one light module of the package (store, run_directory: what `python -m dsrecipes
# --help` needs) does not import validate's checks, which import torch and the parallelism strategies.
__getattr__ = lazy_exports(__name__, _EXPORTS)
