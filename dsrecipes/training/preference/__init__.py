"""dsrecipes.training.preference: preference-optimisation losses (DPO and its IPO / hinge variants) in pure torch,
computed from the per-sequence log-probabilities of a policy and a frozen reference model."""

from dsrecipes.training.preference.dpo_loss import DPO_LOSS_TYPES, DPOOutputs, dpo_loss, sequence_logps

__all__ = ["DPO_LOSS_TYPES", "DPOOutputs", "dpo_loss", "sequence_logps"]
