"""Runs that survive their environment: unique run directories, verified checkpoints, disk faults, signals."""

from __future__ import annotations

import errno
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from dsrecipes.config import run_directory
from dsrecipes.training.checkpointing import checkpoint as checkpoints
from dsrecipes.training.checkpointing.checkpoint import CheckpointSaveError
from tests.helpers.distributed import run_distributed
from tests.helpers.environment import subprocess_env
from tests.unit.test_reliability import _target, saved_steps, small_engine, step


# ---------------------------------------------------------------- run directories
def _claim(parent, queue):
    run_directory.forget_claims()
    queue.put(run_directory.run_dir(parent, "10-00-00", "gpt"))


def test_runs_started_in_the_same_second_get_distinct_directories(tmp_path):
    queue = multiprocessing.get_context("fork").Queue()
    workers = [multiprocessing.get_context("fork").Process(target=_claim, args=(str(tmp_path), queue)) for _ in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    claimed = sorted(queue.get(timeout=5) for _ in workers)
    assert len(set(claimed)) == 6
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["10-00-00_gpt"] + [f"10-00-00-{n}_gpt" for n in range(2, 7)])


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 256 kB file system (tmpfs), where root may mount one; skipped elsewhere (the tests above fake the error)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_really_full_disk_is_one_clear_error(tiny_disk, monkeypatch):
    engine = small_engine()
    monkeypatch.setattr(checkpoints, "check_free_space", lambda *args: None)  # the write itself must fail cleanly
    saved_steps(engine, tiny_disk, 1)
    (tiny_disk / "filler").write_bytes(bytes(shutil.disk_usage(tiny_disk).free - 4096))
    step(engine)
    with pytest.raises(CheckpointSaveError, match="No space left on device"):
        engine.save_checkpoint(tiny_disk)
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["filler", "latest", "step_1"]
    small_engine().load_checkpoint(tiny_disk)


def _rank_one_cannot_write(rank, world_size, save_dir):
    engine = small_engine()
    step(engine)
    if rank == 1:
        real = torch.save

        def full_disk(obj, path, *args, **kwargs):
            if "rng_rank1" in _target(path):
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            return real(obj, path, *args, **kwargs)
        torch.save = full_disk
    started = time.monotonic()
    with pytest.raises(CheckpointSaveError, match="rank 1: No space left on device"):
        engine.save_checkpoint(save_dir)
    assert time.monotonic() - started < 30  # every rank learns at once, nobody waits for a timeout
    torch.distributed.barrier()  # the writer (rank 0) removed the temporary directory before raising
    assert not any(p.name.startswith(".tmp_") for p in save_dir.iterdir())


@pytest.mark.slow
def test_one_rank_failing_its_write_fails_the_save_on_every_rank(tmp_path):
    run_distributed(_rank_one_cannot_write, 2, tmp_path, timeout_s=120)


# ---------------------------------------------------------------- signals
def _start(args, cwd, datasets_cache):
    env = subprocess_env()
    command = [sys.executable, "-m", "dsrecipes", "model=gpt_debug", "model.max_seq_len=64", "data.max_bytes=300000",
               f"data.cache_dir={datasets_cache}", "trainer.max_steps=100000", "trainer.log_interval=1",
               "trainer.eval_interval=0", "trainer.progress_bar=false", "checkpoint.interval=2", "logger=jsonl", *args]
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for_checkpoint(cwd, process, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(cwd.glob("outputs/*/*/checkpoints/step_*")) and process.poll() is None:
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    raise TimeoutError("no checkpoint appeared")


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "signum"), [(1, signal.SIGTERM), (2, signal.SIGINT)])
def test_a_signal_stops_every_worker_quietly_and_says_where_to_resume(tmp_path, datasets_cache, workers, signum):
    args = [] if workers == 1 else ["zero.stage=1", f"launcher.nproc_per_node={workers}"]
    process = _start(args, tmp_path, datasets_cache)
    _wait_for_checkpoint(tmp_path, process)
    stopped_at = time.monotonic()
    os.killpg(process.pid, signum) if signum == signal.SIGINT else process.send_signal(signum)  # Ctrl-C: the group
    out, err = process.communicate(timeout=60)
    assert time.monotonic() - stopped_at < 20
    assert process.returncode == 128 + signum, err[-3000:]
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    assert f"dsrecipes: stopped by {signal.Signals(signum).name}" in err
    (run,) = tmp_path.glob("outputs/*/*")
    log = (run / "logs" / "rank0.log").read_text()
    assert "interrupted at step" in log and "trainer.resume=auto" in log
    assert list(run.glob("checkpoints/step_*"))
