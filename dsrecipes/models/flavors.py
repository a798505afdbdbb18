"""Named model flavors: the conf/model/*.yaml files, readable without Hydra.

The YAML files in dsrecipes.conf/model are the single source of truth for flavors, so the recipe
(`model=llama_7b`) and Python (`GPT(load_flavor("llama_7b", vocab_size=32000))`) agree.
"""

from __future__ import annotations

from importlib import resources

from omegaconf import OmegaConf

from dsrecipes.models.config import ModelConfig
from dsrecipes.models.hf_config import register_hf_resolver

# Options of the model group that are not a fixed shape: `hf` takes it from a checkpoint (load_flavor("hf", path=DIR)).
CHECKPOINT_OPTIONS = ("hf",)


def available_flavors() -> list[str]:
    folder = resources.files("dsrecipes.conf") / "model"
    names = (p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))
    return sorted(name for name in names if name not in CHECKPOINT_OPTIONS)


def load_flavor(name: str, **overrides) -> ModelConfig:
    """ModelConfig of flavor `name` with keyword overrides (e.g. vocab_size=257)."""
    flavors = available_flavors()
    if name not in flavors and name not in CHECKPOINT_OPTIONS:
        raise ValueError(f"unknown model flavor {name!r}; choose one of: {', '.join(flavors)}")
    register_hf_resolver()
    text = (resources.files("dsrecipes.conf") / "model" / f"{name}.yaml").read_text()
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.create(text), overrides)
    return OmegaConf.to_object(merged)
