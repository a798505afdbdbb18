"""Run directories: one start time per run, and a directory no other run shares.

conf/config.yaml names a run's directory with two resolvers:

    hydra.run.dir:   ${run_dir:outputs/${run_stamp:%Y-%m-%d},${run_stamp:%H-%M-%S},${name}}
                     -> outputs/2026-12-01/14-07-25_gpt, or 14-07-25-2_gpt when that one is taken
    hydra.sweep.dir: ${run_dir:outputs/multirun/${run_stamp:%Y-%m-%d},${run_stamp:%H-%M-%S},${name}}

`run_dir` claims the directory with os.mkdir, which is atomic: of two runs started in the same
second with the same name (two users, a retried SLURM job), exactly one gets `14-07-25_gpt` and
the other `14-07-25-2_gpt`; the name stays last, so `trainer.resume=auto` still finds the runs of
a name by `*_<name>`. Resuming on purpose sets hydra.run.dir to the existing directory, which
bypasses the claim. Under a launcher (torchrun, srun) rank 0 claims and the other ranks receive
its answer, so every rank writes into one directory.

Both resolvers cache per process and are registered with OmegaConf's cache: Hydra copies a sweep's
resolver cache into every job's config, so the jobs of a multirun (in this process or, with the
submitit launcher, on other nodes) see the sweep's directory rather than claiming new ones.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from dsrecipes.distributed.utils import rank_zero_result

RUN_STAMP_ENV = "DSRECIPES_RUN_STAMP"

_STAMP: list[datetime] = []
_CLAIMED: dict[tuple[str, str, str], str] = {}


def run_stamp(fmt: str) -> str:
    """`${run_stamp:%H-%M-%S}`: the run's start time, one value per run even across ranks.

    Under a launcher rank 0's time is shared through DSRECIPES_RUN_STAMP (Hydra's `now` would give
    each rank its own directory); otherwise the first call's time, cached for the process.
    """
    shared = os.environ.get(RUN_STAMP_ENV)
    if shared:
        return datetime.fromisoformat(shared).strftime(fmt)
    if not _STAMP:
        _STAMP.append(datetime.now())
    return _STAMP[0].strftime(fmt)


def run_dir(parent: str, stamp: str, name: str) -> str:
    """`${run_dir:PARENT,STAMP,NAME}`: PARENT/STAMP_NAME, claimed atomically (PARENT/STAMP-2_NAME, -3, ... if taken)."""
    key = (str(parent), str(stamp), str(name))
    if key not in _CLAIMED:
        _CLAIMED[key] = rank_zero_result(lambda: claim_run_dir(*key))
    return _CLAIMED[key]


def claim_run_dir(parent: str, stamp: str, name: str) -> str:
    """Create and return the first free PARENT/STAMP[-N]_NAME; a ValueError naming the key when it cannot be made."""
    if not str(name).strip() or "/" in str(name) or str(name) in (".", ".."):
        raise ValueError(f"name={name!r}: a run name must be a non-empty single path component (it names the run directory)")
    base = Path(parent)
    try:
        base.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, 10_000):
            candidate = base / (f"{stamp}_{name}" if attempt == 1 else f"{stamp}-{attempt}_{name}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            return str(candidate)
    except (NotADirectoryError, FileExistsError, PermissionError, OSError) as error:
        raise ValueError(
            f"hydra.run.dir: cannot create the run directory under {base} ({error.strerror or error}); "
            "choose a writable place with hydra.run.dir=PATH"
        ) from None
    raise ValueError(f"hydra.run.dir: every name {stamp}-N_{name} under {base} is taken")


def forget_claims() -> None:
    """Drop this process's cached start time and claimed directories (tests start several runs in one process)."""
    _STAMP.clear()
    _CLAIMED.clear()
