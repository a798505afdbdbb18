"""The autotuner's search space: zero.stage x micro-batch (x activation checkpointing, x CPU offload).

A Candidate is one point; its overrides are what a trial adds to the user's command line. Groups are the
(stage, checkpointing, offload) combinations; each group gets its own micro-batch sizes, because how large
a micro-batch fits depends on the group (dsrecipes.profiling.autotuning.pruning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

AC_CHOICES = ("none", "full")
OFFLOAD_CHOICES = ("none", "cpu")


@dataclass(frozen=True, order=True)
class Group:
    """The part of a candidate that changes the model-state memory (the micro-batch changes the activations)."""

    zero_stage: int
    activation_checkpointing: str = ""  # "" = the recipe's own (not tuned) | none | full
    offload: str = "none"


@dataclass(frozen=True, order=True)
class Candidate:
    """One configuration to measure."""

    zero_stage: int
    activation_checkpointing: str = ""  # "" = the recipe's own (not tuned) | none | full
    offload: str = "none"
    micro_batch: int = 1

    @property
    def group(self) -> Group:
        return Group(self.zero_stage, self.activation_checkpointing, self.offload)

    @property
    def label(self) -> str:
        """Short and unique: `z2 mb16`, `z3 mb8 ac=full offload`."""
        parts = [f"z{self.zero_stage}", f"mb{self.micro_batch}"]
        if self.activation_checkpointing:
            parts.append(f"ac={self.activation_checkpointing}")
        if self.offload != "none":
            parts.append("offload")
        return " ".join(parts)

    def overrides(self) -> list[str]:
        """The command-line overrides that select this candidate (the batch triple becomes micro + accumulation)."""
        out = [f"zero.stage={self.zero_stage}", f"trainer.train_micro_batch_size_per_gpu={self.micro_batch}",
               "trainer.train_batch_size=null"]
        if self.activation_checkpointing:
            out.append(f"activation_checkpointing={self.activation_checkpointing}")
        if self.offload != "none":
            out.append(f"zero.offload_optimizer={self.offload}")
        return out

    def settings(self) -> dict:
        """The values this candidate sets, as nested config (what the best experiment writes)."""
        zero: dict = {"stage": self.zero_stage}
        if self.offload != "none":
            zero["offload_optimizer"] = self.offload
        return {"zero": zero, "trainer": {"train_micro_batch_size_per_gpu": self.micro_batch, "train_batch_size": None}}


def search_groups(stages: list[int], fast: bool, offload: bool) -> list[Group]:
    """(stage, checkpointing, offload) combinations in grid order: stage, then checkpointing, then offload.

    fast: stages only (recipe's checkpointing kept); otherwise x none/full checkpointing and, when `offload`
    (trials on CUDA), x CPU optimizer offload for stages 2 and 3 (dsrecipes offloads through FSDP2 there).
    """
    groups = []
    for stage in stages:
        for ac in (("",) if fast else AC_CHOICES):
            for where in OFFLOAD_CHOICES if (not fast and offload and stage >= 2) else ("none",):
                groups.append(Group(stage, ac, where))
    return groups


def micro_batch_sizes(low: int, high: int, count: int) -> list[int]:
    """`count` sizes from `low` to `high`, spread geometrically (powers of two between powers of two), distinct.

    >>> micro_batch_sizes(1, 64, 4)
    [1, 4, 16, 64]
    """
    if high < low:
        return []
    if count == 1 or high == low:
        return [high]
    ratio = math.log(high / low)
    sizes = {low, high}
    for k in range(1, count - 1):
        sizes.add(int(round(low * math.exp(ratio * k / (count - 1)))))
    return sorted(sizes)


def candidates_of(groups: list[Group], sizes: dict[Group, list[int]]) -> list[Candidate]:
    """Every candidate, in grid order: group order, then micro-batch ascending."""
    return [Candidate(g.zero_stage, g.activation_checkpointing, g.offload, m) for g in groups for m in sizes.get(g, [])]
