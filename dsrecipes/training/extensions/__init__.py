"""dsrecipes.training.extensions: what a recipe adds to the loop without the Trainer knowing it (model transforms,
loss terms, batch hooks and sources, callbacks; base.py), the recipe's own list (recipe.py) and the extensions and
callbacks of compression, data efficiency, MoE, profiling, FLOPs, traces and the comms logger."""

from dsrecipes.training.extensions.base import Callback, Extensions, RunContext  # the API an extension is written to

__all__ = ["Callback", "Extensions", "RunContext"]
