"""The autotuner's search space: zero.stage x micro-batch (x activation checkpointing, x CPU offload).

A Candidate is one point; its overrides are what a trial adds to the user's command line. Groups are the
(stage, checkpointing, offload) combinations; each group gets its own micro-batch sizes, because how large
a micro-batch fits depends on the group (dsrecipes.profiling.autotuning.pruning).

A candidate's micro-batch is per rank, as the memory estimate counts it, and the global batch follows it
(micro x the recipe's accumulation x the data-parallel ranks). A TrialLayout is what a candidate's job trains,
read from its composed and checked config: the results show it, and the session refuses a candidate whose
job would train another micro-batch than its label says.
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
    micro_batch: int = 1  # per rank (trainer.train_micro_batch_size_per_gpu)
    # launcher.nproc_per_node the trial pins (None: the recipe's). Set where launcher.nproc_per_node=auto would
    # split the recipe's global batch over the CPU workers it starts (dsrecipes.config.auto_workers), shrinking
    # the micro-batch or the accumulation: pinned, each rank trains `micro_batch` with the recipe's accumulation.
    workers: int | None = None

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
        if self.workers is not None:
            out.append(f"launcher.nproc_per_node={self.workers}")
        return out

    def settings(self) -> dict:
        """The values this candidate sets, as nested config (what the best experiment writes)."""
        zero: dict = {"stage": self.zero_stage}
        if self.offload != "none":
            zero["offload_optimizer"] = self.offload
        out = {"zero": zero, "trainer": {"train_micro_batch_size_per_gpu": self.micro_batch, "train_batch_size": None}}
        if self.workers is not None:
            out["launcher"] = {"nproc_per_node": str(self.workers)}
        return out


@dataclass(frozen=True)
class TrialLayout:
    """What a candidate's job trains, from its composed config as the job's own checks leave it."""

    candidate: Candidate  # as launched (the sweeper may pin its worker count: Candidate.workers)
    world_size: int  # ranks the trial starts
    micro_batch: int  # per rank
    accumulation: int  # gradient accumulation steps
    train_batch_size: int  # the global batch: micro x accumulation x data-parallel ranks

    def describe(self) -> str:
        return (f"{self.world_size} rank(s), micro-batch {self.micro_batch} per rank x accumulation {self.accumulation}"
                f" = global batch {self.train_batch_size}")


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
