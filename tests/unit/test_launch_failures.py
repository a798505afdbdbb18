"""How a failed job names its root cause (dsrecipes.launch.workers.with_unobserved_failures), on error files written here.

When rank 1 raises and rank 0 then fails in the collective rank 1 left, the agent may see rank 0 exit first and
never report rank 1; the job must still end with rank 1's traceback (its error file is there).
"""

from __future__ import annotations

import json

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from dsrecipes.launch.workers import with_unobserved_failures


def _error_file(attempt, local_rank: int, message: str, timestamp: int) -> str:
    folder = attempt / str(local_rank)
    folder.mkdir(parents=True)
    path = folder / "error.json"
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {
        "py_callstack": f"Traceback (most recent call last):\n{message}\n", "timestamp": str(timestamp)}}}))
    return str(path)


def _seen(rank: int, local_rank: int, error_file: str, exitcode: int = 1) -> ChildFailedError:
    """The agent's report of the one failure it saw."""
    return ChildFailedError("worker_main", {rank: ProcessFailure(local_rank=local_rank, pid=11, exitcode=exitcode,
                                                                 error_file=error_file)})


def test_a_rank_the_agent_did_not_see_fail_becomes_the_root_cause(tmp_path):
    attempt = tmp_path / "attempt_0"
    peer = _error_file(attempt, 0, "RuntimeError: Read error: Connection reset by peer", 1000)
    _error_file(attempt, 1, "RuntimeError: injected failure on rank 1 at step 3", 1000)
    seen = _seen(0, 0, peer)
    error = with_unobserved_failures(seen)
    rank, root = error.get_first_failure()
    assert rank == 1 and "injected failure on rank 1" in str(root.message)
    assert set(error.failures) == {0, 1}
    assert "injected failure on rank 1 at step 3" in str(error) and "Connection reset by peer" in str(error)


def test_a_later_error_does_not_displace_an_earlier_root_cause_and_global_ranks_follow_the_node(tmp_path):
    attempt = tmp_path / "attempt_0"
    first = _error_file(attempt, 0, "ValueError: the first error", 1000)
    _error_file(attempt, 1, "RuntimeError: Connection closed by peer", 1003)
    seen = _seen(2, 0, first)
    error = with_unobserved_failures(seen)
    assert set(error.failures) == {2, 3}  # node rank 1 of 2 x 2: local ranks 0, 1 are global 2, 3
    assert error.get_first_failure()[0] == 2


def test_nothing_to_add_keeps_the_error(tmp_path):
    only = _error_file(tmp_path / "attempt_0", 0, "ValueError: alone", 1000)
    seen = _seen(0, 0, only)
    assert with_unobserved_failures(seen) is seen
    signalled = _seen(0, 0, "", exitcode=-9)
    assert with_unobserved_failures(signalled) is signalled
