"""Run directories: one start time per run, and a directory no other run shares.

conf/config.yaml names a run's directory with two resolvers:

    hydra.run.dir:   ${run_dir:outputs/${run_stamp:%Y-%m-%d},${run_stamp:%H-%M-%S},${name},${mode}}
                     -> outputs/2026-12-01/14-07-25_gpt, or 14-07-25-2_gpt when that one is taken
    hydra.sweep.dir: ${run_dir:outputs/multirun/${run_stamp:%Y-%m-%d},${run_stamp:%H-%M-%S},${name}}

`run_dir` claims the directory with os.mkdir, which is atomic: of two runs started in the same
second with the same name (two users, a retried SLURM job), exactly one gets `14-07-25_gpt` and
the other `14-07-25-2_gpt`; the name stays last, so `trainer.resume=auto` still finds the runs of
a name by `*_<name>`. Resuming on purpose sets hydra.run.dir to the existing directory, which
bypasses the claim. Under a launcher (torchrun, srun) rank 0 claims and the other ranks receive
its answer, so every rank writes into one directory.

A single `mode=generate` run has no run directory: it prints to the console and writes only
generate.output_file, so a directory would hold nothing but Hydra's .hydra/ record. For it `run_dir`
returns "." (the working directory: Hydra's mkdir of it is a no-op and nothing is claimed) and
`${config_subdir:${mode},${hydra.runtime.output_dir}}`, Hydra's output_subdir, keeps .hydra/ out of
the working directory. A generate job that has a directory all the same (hydra.run.dir=PATH, or a
multirun job) gets .hydra/ and writes its generations there (dsrecipes.inference_cli). An inference
job that fails before writing anything removes its directory again (`remove_unused_run_dir`).

Both resolvers cache per process and are registered with OmegaConf's cache: Hydra copies a sweep's
resolver cache into every job's config, so the jobs of a multirun (in this process or, with the
submitit launcher, on other nodes) see the sweep's directory rather than claiming new ones.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime
from pathlib import Path

RUN_STAMP_ENV = "DSRECIPES_RUN_STAMP"
NO_RUN_DIR_MODES = ("generate",)  # modes whose single run writes only to the console and files named by the user
HYDRA_SUBDIR = ".hydra"
_HYDRA_RECORD = {"config.yaml", "hydra.yaml", "overrides.yaml"}  # what Hydra writes into <run dir>/.hydra/

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


def run_dir(parent: str, stamp: str, name: str, mode: str = "train") -> str:
    """`${run_dir:PARENT,STAMP,NAME,MODE}`: PARENT/STAMP_NAME, claimed atomically (PARENT/STAMP-2_NAME, -3, ... if taken).

    In a mode of NO_RUN_DIR_MODES: "." (the working directory), and nothing is created or claimed.
    """
    if str(mode) in NO_RUN_DIR_MODES:
        return "."
    key = (str(parent), str(stamp), str(name))
    if key not in _CLAIMED:
        # imported here: it imports torch.distributed, and composing a recipe (`--help`, `--cfg job`) must not
        from dsrecipes.distributed.utils import rank_zero_result

        _CLAIMED[key] = rank_zero_result(lambda: claim_run_dir(*key))
    return _CLAIMED[key]


def was_claimed(path: str) -> bool:
    """Whether this process's run_dir resolver created `path` (rather than the user naming it with hydra.run.dir)."""
    return any(os.path.realpath(claimed) == os.path.realpath(str(path)) for claimed in _CLAIMED.values())


def is_working_dir(path: str) -> bool:
    """Whether a job's output directory is the directory the command started in: the job has no run directory of its own.

    The start directory is Hydra's runtime.cwd where Hydra runs the job (with hydra.job.chdir=true the
    job has changed into its output directory by the time this is asked), else the current one.
    """
    from hydra.core.hydra_config import HydraConfig

    start = HydraConfig.get().runtime.cwd if HydraConfig.initialized() else os.getcwd()
    return os.path.realpath(str(path)) == os.path.realpath(start)


def config_subdir(mode: str, output_dir: str) -> str | None:
    """`${config_subdir:${mode},${hydra.runtime.output_dir}}` (hydra.output_subdir): where Hydra records the job's config.

    ".hydra" inside every run directory; None (no record) for a job of NO_RUN_DIR_MODES that has none,
    so that nothing is written into the working directory.
    """
    if str(mode) in NO_RUN_DIR_MODES and is_working_dir(output_dir):
        return None
    if _submitit_task_rank() > 0:  # every task of a multi-task submitit job runs Hydra's job: rank 0 records it
        return None
    return HYDRA_SUBDIR


def _submitit_task_rank() -> int:
    """This process's global rank inside a submitit job (hydra/launcher=slurm, slurm_local); 0 elsewhere."""
    import os

    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return 0
    try:
        import submitit

        return submitit.JobEnvironment().global_rank
    except (ImportError, RuntimeError, KeyError, ValueError):
        return 0


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


def remove_unused_run_dir(path: str | Path) -> bool:
    """Remove a run directory that holds Hydra's .hydra/ record and nothing else (its job failed before writing
    anything), then the date folder it was claimed in when that is left empty. Returns whether it removed it."""
    path = Path(path)
    try:
        entries = {p.name for p in path.iterdir()}
        record = {p.name for p in (path / HYDRA_SUBDIR).iterdir()} if (path / HYDRA_SUBDIR).is_dir() else set()
    except OSError:
        return False
    if entries != {HYDRA_SUBDIR} or not record <= _HYDRA_RECORD:
        return False
    claimed = was_claimed(str(path))
    shutil.rmtree(path, ignore_errors=True)
    if claimed:  # outputs/<date>/ was made for this run; a directory the user named keeps its parent
        try:
            path.parent.rmdir()
        except OSError:
            pass  # other runs are in it
    return True


def forget_claims() -> None:
    """Drop this process's cached start time and claimed directories (tests start several runs in one process)."""
    _STAMP.clear()
    _CLAIMED.clear()
