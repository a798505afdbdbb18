"""Small torch.distributed helpers that are no-ops in a single process."""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def mean_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """All-reduce average (a copy); the tensor itself in a single process."""
    if not is_distributed():
        return tensor
    out = tensor.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / dist.get_world_size()


@contextlib.contextmanager
def rank_zero_first():
    """Rank 0 runs the body first (e.g. filling a cache), the other ranks after it."""
    distributed = is_distributed()
    if distributed and dist.get_rank() != 0:
        dist.barrier()
    yield
    if distributed and dist.get_rank() == 0:
        dist.barrier()


def maybe_inject_failure(rank: int, step: int) -> None:
    """Fault-injection hook for the launcher's failure tests: DSRECIPES_TEST_FAIL_RANK / _STEP make that
    rank raise at that step, so a test can check the job ends with the rank's traceback instead of hanging."""
    fail_rank, fail_step = os.environ.get("DSRECIPES_TEST_FAIL_RANK"), os.environ.get("DSRECIPES_TEST_FAIL_STEP")
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"  # restarted workers run clean
    if fail_rank is not None and first_attempt and int(fail_rank) == rank and int(fail_step or 0) == step:
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")


def rank_zero_result(make):
    """make() on rank 0 only, its result (picklable) broadcast to every rank; one process: make().

    A ValueError or FileNotFoundError raised by make() on rank 0 is raised on every rank, with its
    message, so a decision taken once (a directory claimed, a checkpoint chosen) fails everywhere alike.
    """
    if not is_distributed() or dist.get_world_size() == 1:
        return make()
    box = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", make())
        except (ValueError, FileNotFoundError) as error:
            box[0] = (type(error).__name__, str(error))
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status == "ok":
        return value
    raise (FileNotFoundError if status == "FileNotFoundError" else ValueError)(value)


def errors_of_every_rank(local_error: str | None) -> list[str]:
    """Every rank's error message (None where it had none), gathered so that all ranks see them.

    For steps where one rank can fail alone (a disk write): a plain barrier would leave the others
    waiting until the collective timeout; this way every rank learns of the failure at once.
    """
    if not is_distributed():
        return [local_error] if local_error else []
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local_error)
    return [f"rank {rank}: {message}" for rank, message in enumerate(gathered) if message]
