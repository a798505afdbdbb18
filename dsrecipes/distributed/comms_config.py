"""Schema of the `comms_logger` config group (DeepSpeed's comms_logger block) and the names of the ops it logs.

    python -m dsrecipes comms_logger=enabled zero.stage=2 launcher.nproc_per_node=2
    python -m dsrecipes comms_logger=enabled comms_logger.prof_all=false comms_logger.prof_ops=[all_reduce]

The keys and defaults are DeepSpeed's (deepspeed/comm/config.py): enabled false, verbose false,
prof_all true, prof_ops [], debug false. Op names are DeepSpeed's too; torch 2.13's new spellings
all_gather_single / reduce_scatter_single are logged (and may be named in prof_ops) as
all_gather_into_tensor / reduce_scatter_tensor, DeepSpeed's names for the same collectives.
The recorder is dsrecipes.distributed.comms_logger.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import ClassVar

from dsrecipes.utils.inactive_rules import Inactive, switched_off
from dsrecipes.utils.recipe_facts import RecipeFacts

# DeepSpeed's op names, as logged; what counts as a message for each is in comms_logger.OP_TABLE
COMM_OPS: tuple[str, ...] = (
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast", "reduce", "gather", "scatter", "barrier",
)
# torch.distributed spellings of the same collectives (torch 2.13 renamed two, older private ones remain)
OP_ALIASES: dict[str, str] = {
    "all_gather_single": "all_gather_into_tensor", "_all_gather_base": "all_gather_into_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor", "_reduce_scatter_base": "reduce_scatter_tensor",
}


@dataclass
class CommsLoggerConfig:
    """DeepSpeed's comms_logger: every collective issued through torch.distributed's Python API while
    training is counted with op, message size, latency, algbw/busbw; a per-op / per-size table at the end
    (rank 0), <run dir>/comms.json and comms.csv, comm/bytes_per_step and comm/time_per_step per step.

    Logged ops are made blocking (waited on, and the device synchronised) so their latency is their
    own, as DeepSpeed does: turn it on to measure, not for the fastest run.
    """

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        switched_off(hint=" (choose comms_logger=enabled)"),
        Inactive(lambda root, c: c.prof_all, lambda root, path: "comms_logger.prof_all=true logs every op",
                 keys=("prof_ops",)),
    )

    enabled: bool = False
    verbose: bool = False  # print every logged op as it completes (rank 0), as DeepSpeed
    prof_all: bool = True  # log every op; false: only those named in prof_ops
    prof_ops: list[str] = field(default_factory=list)  # e.g. [all_reduce, all_gather_into_tensor]
    debug: bool = False  # append the calling function's name to each record (DeepSpeed: "| [Caller Func: f]")

    def check(self, facts: RecipeFacts) -> None:
        """The group's own checks (dsrecipes.config.validate walks the groups)."""
        validate_comms_logger_config(self)


def canonical_op(name: str) -> str:
    """DeepSpeed's name of a torch.distributed collective (all_gather_single -> all_gather_into_tensor)."""
    return OP_ALIASES.get(name, name)


def validate_comms_logger_config(cfg: CommsLoggerConfig) -> None:
    """prof_ops must name known ops (DeepSpeed's spelling or torch's); checked before any worker starts."""
    prof_ops = list(cfg.prof_ops)
    unknown = [op for op in prof_ops if canonical_op(op) not in COMM_OPS]
    if unknown:
        raise ValueError(
            f"comms_logger.prof_ops={prof_ops}: unknown op name(s) {unknown}; valid: {', '.join(COMM_OPS)} "
            f"(torch's spellings {', '.join(OP_ALIASES)} are accepted too)"
        )
    if cfg.enabled and not cfg.prof_all and not prof_ops:
        warnings.warn("comms_logger.prof_all=false with comms_logger.prof_ops=[] logs no op; name the ops to log "
                      "(e.g. comms_logger.prof_ops=[all_reduce]) or set prof_all=true", UserWarning, stacklevel=2)


def profiled_ops(cfg: CommsLoggerConfig) -> frozenset[str]:
    """The DeepSpeed op names the recorder logs: all of them with prof_all, else prof_ops'."""
    if cfg.prof_all:
        return frozenset(COMM_OPS)
    return frozenset(canonical_op(op) for op in cfg.prof_ops)
