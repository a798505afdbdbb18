"""Named model flavors: the conf/model/*.yaml files, readable without Hydra.

The YAML files in dsrecipes.conf/model are the single source of truth for flavors, so the recipe
(`model=llama_7b`) and Python (`GPT(load_flavor("llama_7b", vocab_size=32000))`) agree.
"""

from __future__ import annotations

from importlib import resources

from omegaconf import OmegaConf

from dsrecipes.models.config import ModelConfig


def available_flavors() -> list[str]:
    folder = resources.files("dsrecipes.conf") / "model"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_flavor(name: str, **overrides) -> ModelConfig:
    """ModelConfig of flavor `name` with keyword overrides (e.g. vocab_size=257)."""
    flavors = available_flavors()
    if name not in flavors:
        raise ValueError(f"unknown model flavor {name!r}; choose one of: {', '.join(flavors)}")
    text = (resources.files("dsrecipes.conf") / "model" / f"{name}.yaml").read_text()
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.create(text), overrides)
    return OmegaConf.to_object(merged)
