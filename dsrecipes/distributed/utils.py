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
