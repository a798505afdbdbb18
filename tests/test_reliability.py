"""Runs that survive their environment: unique run directories, verified checkpoints, disk faults, signals."""

from __future__ import annotations

import errno
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import namedtuple

import pytest
import torch
from torch import nn

import dsrecipes
from dsrecipes.config import run_directory
from dsrecipes.training import checkpoint as checkpoints
from dsrecipes.training.checkpoint import CheckpointSaveError, find_resume_checkpoint, verify_checkpoint
from tests.helpers.distributed import run_distributed
from tests.helpers.environment import subprocess_env

CONFIG = {
    "trainer": {"train_micro_batch_size_per_gpu": 4, "device": "cpu"},
    "optimizer": {"lr": 1e-2},
    "lr_scheduler": {"name": "constant"},
}


def small_engine(**config):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    return dsrecipes.initialize(model=model, config=CONFIG | config)[0]


def step(engine):
    loss = engine(torch.randn(4, 4)).square().mean()
    engine.backward(loss)
    engine.step()


def saved_steps(engine, save_dir, steps):
    for _ in range(steps):
        step(engine)
        engine.save_checkpoint(save_dir)


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


def test_a_process_keeps_the_directory_it_claimed(tmp_path):
    run_directory.forget_claims()
    first = run_directory.run_dir(str(tmp_path), "10-00-00", "gpt")
    assert run_directory.run_dir(str(tmp_path), "10-00-00", "gpt") == first  # Hydra resolves it more than once
    run_directory.forget_claims()
    assert run_directory.run_dir(str(tmp_path), "10-00-00", "gpt").endswith("10-00-00-2_gpt")
    run_directory.forget_claims()


@pytest.mark.parametrize("name", ["", "a/b", ".."])
def test_a_run_name_that_cannot_name_a_directory_is_refused(tmp_path, name):
    with pytest.raises(ValueError, match="name="):
        run_directory.claim_run_dir(str(tmp_path), "10-00-00", name)


def test_a_run_directory_under_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ValueError, match="hydra.run.dir: cannot create the run directory"):
        run_directory.claim_run_dir(str(tmp_path / "file" / "outputs"), "10-00-00", "gpt")


# ---------------------------------------------------------------- verified checkpoints
def test_every_checkpoint_has_a_manifest_that_load_verifies(tmp_path):
    engine = small_engine()
    saved_steps(engine, tmp_path, 1)
    listed = (tmp_path / "step_1" / checkpoints.MANIFEST).read_text()
    assert "engine.pt" in listed and "rng_rank0.pt" in listed
    verify_checkpoint(tmp_path / "step_1")
    engine.load_checkpoint(tmp_path)


@pytest.mark.parametrize("change", ["same_size_garbage", "truncated", "deleted"])
def test_a_damaged_file_is_named_and_nothing_loads(tmp_path, change):
    engine = small_engine()
    saved_steps(engine, tmp_path, 1)
    (shard,) = (tmp_path / "step_1" / "dcp").glob("*.distcp")
    if change == "same_size_garbage":
        shard.write_bytes(os.urandom(shard.stat().st_size))
    elif change == "truncated":
        shard.write_bytes(shard.read_bytes()[:100])
    else:
        shard.unlink()
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    with pytest.raises(ValueError, match=rf"failed verification: dcp/{shard.name}"):
        engine.load_checkpoint(tmp_path)
    assert all(torch.equal(before[k], v) for k, v in engine.module.state_dict().items())


def test_resume_auto_passes_over_a_damaged_checkpoint_for_the_one_before(tmp_path, caplog):
    run = tmp_path / "outputs" / "2026-12-01" / "10-00-00_gpt"
    engine = small_engine()
    saved_steps(engine, run / "checkpoints", 2)
    model_file = next((run / "checkpoints" / "step_2" / "dcp").glob("*.distcp"))
    model_file.write_bytes(bytes(model_file.stat().st_size))  # same size, zeros
    logger = logging.getLogger("dsrecipes")  # a Trainer run earlier in this process stops its propagation
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level("WARNING", logger="dsrecipes"):
            found = find_resume_checkpoint("auto", run, "checkpoints", "gpt")
    finally:
        logger.removeHandler(caplog.handler)
    assert found == run / "checkpoints" / "step_1"
    assert "skipping step_2" in caplog.text and "does not match its checksum" in caplog.text
    with pytest.raises(ValueError, match="step_2 failed verification"):
        find_resume_checkpoint(str(run / "checkpoints" / "step_2"), run, "checkpoints", "gpt")


def test_a_checkpoint_from_before_manifests_still_loads(tmp_path):
    engine = small_engine()
    saved_steps(engine, tmp_path, 1)
    (tmp_path / "step_1" / checkpoints.MANIFEST).unlink()
    engine.load_checkpoint(tmp_path)


# ---------------------------------------------------------------- disk faults
def _target(path_or_file) -> str:
    """torch.save's destination: checkpoints hand it an open file."""
    return str(getattr(path_or_file, "name", path_or_file))


def _failing_save(real, failure):
    def save(obj, path, *args, **kwargs):
        if _target(path).endswith("engine.pt"):
            raise failure
        return real(obj, path, *args, **kwargs)
    return save


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EROFS, "Read-only file system"),
])
def test_a_failed_write_is_one_clear_error_and_the_previous_checkpoint_stays(tmp_path, monkeypatch, failure):
    engine = small_engine()
    saved_steps(engine, tmp_path, 1)
    step(engine)
    monkeypatch.setattr(torch, "save", _failing_save(torch.save, failure))
    with pytest.raises(CheckpointSaveError, match=rf"checkpoint step_2 could not be saved .*{failure.strerror}.*still .*step_1"):
        engine.save_checkpoint(tmp_path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_1"]  # no temporary directory left
    assert (tmp_path / "latest").read_text() == "step_1"
    verify_checkpoint(tmp_path / "step_1")
    small_engine().load_checkpoint(tmp_path)


def test_a_failed_save_is_reported_as_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    from dsrecipes.utils.errors import USER_ERROR_EXIT_CODE, USER_ERRORS, exit_on_user_error

    engine = small_engine()
    monkeypatch.setattr(torch, "save", _failing_save(torch.save, OSError(errno.ENOSPC, "No space left on device")))
    monkeypatch.delenv("DSRECIPES_DEBUG", raising=False)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(USER_ERRORS) as raised:  # what the CLI and its workers turn into one line
        engine.save_checkpoint(tmp_path)
    with pytest.raises(SystemExit) as exited:
        exit_on_user_error(raised.value)
    assert exited.value.code == USER_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("dsrecipes: error: checkpoint step_0 could not be saved") and err.count("\n") == 1


def test_a_run_directory_that_vanishes_mid_save_is_a_clear_error(tmp_path, monkeypatch):
    engine = small_engine()
    real = torch.save

    def vanishing(obj, path, *args, **kwargs):
        if _target(path).endswith("rng_rank0.pt"):
            shutil.rmtree(tmp_path / "checkpoints")
        return real(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", vanishing)
    step(engine)
    with pytest.raises(CheckpointSaveError, match="No such file or directory"):
        engine.save_checkpoint(tmp_path / "checkpoints")


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


def test_a_save_that_cannot_fit_is_refused_before_writing(tmp_path, monkeypatch):
    engine = small_engine()
    saved_steps(engine, tmp_path, 1)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    step(engine)
    with pytest.raises(CheckpointSaveError, match="not enough free space .*needs about .*KiB, 1000 bytes are free"):
        engine.save_checkpoint(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_1"]


def test_temporaries_of_a_killed_save_are_removed_by_the_next_save(tmp_path):
    engine = small_engine()
    (tmp_path / ".tmp_step_7").mkdir(parents=True)
    (tmp_path / ".tmp_step_7" / "model.pt").write_bytes(b"partial")
    saved_steps(engine, tmp_path, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_1"]


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
