"""The ``dpo`` group: direct preference optimisation on data.format=preference pairs (dsrecipes.training.preference).

    python -m dsrecipes +experiment=dpo dpo.beta=0.1 dpo.loss_type=sigmoid

A plain dataclass (no Hydra), the group's schema; `check` refuses what DPO cannot run with, before any work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dsrecipes.utils.compatibility_rows import Refusal, Supported
from dsrecipes.utils.config_enum import ConfigEnum
from dsrecipes.utils.ranges import POSITIVE, between, ranged


class DPOLossType(ConfigEnum):
    """``dpo.loss_type``: DPO's sigmoid loss, IPO's squared loss, or the hinge (SLiC) loss."""

    sigmoid = "sigmoid"
    ipo = "ipo"
    hinge = "hinge"


def _dpo_model_parallel(root, dims):
    if root.dpo.enabled and (dims.pp > 1 or dims.tp > 1 or dims.sp > 1):
        return (f"dpo.enabled=true is not supported with parallel.pp={dims.pp} parallel.tp={dims.tp} "
                f"parallel.sp={dims.sp}: the sequence log-probabilities are taken from whole logits on each rank; "
                "use ZeRO (zero.stage=0..3), optionally with peft=lora")
    return None


@dataclass
class DPOConfig:
    """enabled: train on preference pairs with the DPO loss instead of the language-model loss.
    beta: the strength of the KL anchor to the reference (the initial model): rewards are beta * log-ratio.
    label_smoothing: conservative DPO's assumed label noise (sigmoid only), in [0, 0.5).
    loss_type: sigmoid (DPO), ipo, hinge.
    The reference log-probabilities are those of the model before its first step, computed once over the train and
    validation pairs when training starts and kept in every checkpoint (a resumed run needs no reference model).
    """

    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("DPO with pp, tp or sp", "the log-probabilities are taken from whole logits", _dpo_model_parallel),
        Supported("DPO under ZeRO 0-3, with or without LoRA", "supported: precomputed reference log-probabilities, "
                  "the loss a mean over every pair of the global batch", ("dpo-lora-dp2-zero3",)),
    )

    enabled: bool = False
    beta: float = ranged(0.1, POSITIVE)
    label_smoothing: float = ranged(0.0, between(0, 0.5, high_open=True))
    loss_type: DPOLossType = DPOLossType.sigmoid

    def check(self, facts) -> None:
        """DPO and preference data go together."""
        data = facts.root.data
        if self.enabled and data.format != "preference":
            raise ValueError(f"dpo.enabled=true trains on preference pairs, but data.format={data.format}; set "
                             "data.format=preference (prompt, chosen, rejected columns)")
        if not self.enabled and data.format == "preference":
            raise ValueError("data.format=preference holds (chosen, rejected) pairs for DPO; turn it on with dpo=dpo "
                             "(or +experiment=dpo)")
        if self.enabled and self.label_smoothing and self.loss_type != "sigmoid":
            raise ValueError(f"dpo.label_smoothing={self.label_smoothing} is for dpo.loss_type=sigmoid only, not "
                             f"{self.loss_type}")
