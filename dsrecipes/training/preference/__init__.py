"""dsrecipes.training.preference: preference-optimisation losses (DPO and its IPO / hinge variants) in pure torch,
computed from the per-sequence log-probabilities of a policy and a frozen reference model, and their recipe
wiring (the dpo group's schema, the reference log-probabilities, the step's objective)."""

from dsrecipes.utils.lazy_exports import lazy_exports

_EXPORTS = {name: "dsrecipes.training.preference.losses"
            for name in ("DPO_LOSS_TYPES", "DPOOutputs", "dpo_loss", "sequence_logps")}
_EXPORTS["DPOConfig"] = "dsrecipes.training.preference.config"

__all__ = sorted(_EXPORTS)

# Lazy: the recipe schema imports dsrecipes.training.preference.config, and composing must not import torch.
__getattr__ = lazy_exports(__name__, _EXPORTS)
