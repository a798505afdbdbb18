"""Runs that survive their environment: unique run directories, verified checkpoints, disk faults, signals."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections import namedtuple

import pytest
import torch
from torch import nn

import dsrecipes
from dsrecipes.config import run_directory
from dsrecipes.training.checkpointing import checkpoint as checkpoints
from dsrecipes.training.checkpointing.checkpoint import CheckpointSaveError, find_resume_checkpoint, verify_checkpoint

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


def _resume_auto_logging_warnings(run, caplog):
    """find_resume_checkpoint("auto") of run, its "dsrecipes" warnings captured by caplog (a Trainer run earlier in
    this process stops that logger's propagation, so caplog's handler is attached to it directly)."""
    logger = logging.getLogger("dsrecipes")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level("WARNING", logger="dsrecipes"):
            return find_resume_checkpoint("auto", run, "checkpoints", "gpt")
    finally:
        logger.removeHandler(caplog.handler)


def test_resume_auto_passes_over_a_damaged_checkpoint_for_the_one_before(tmp_path, caplog):
    run = tmp_path / "outputs" / "2026-12-01" / "10-00-00_gpt"
    engine = small_engine()
    saved_steps(engine, run / "checkpoints", 2)
    model_file = next((run / "checkpoints" / "step_2" / "dcp").glob("*.distcp"))
    model_file.write_bytes(bytes(model_file.stat().st_size))  # same size, zeros
    found = _resume_auto_logging_warnings(run, caplog)
    assert found == run / "checkpoints" / "step_1"
    assert "skipping step_2" in caplog.text and "does not match its checksum" in caplog.text
    with pytest.raises(ValueError, match="step_2 failed verification"):
        find_resume_checkpoint(str(run / "checkpoints" / "step_2"), run, "checkpoints", "gpt")


def test_resume_auto_says_why_it_passes_over_an_unmarked_checkpoint_and_clears_a_killed_save(tmp_path, caplog):
    """A newest checkpoint whose engine.pt (the completion marker) was deleted is passed over with a warning naming
    it, and the hidden directory of a save killed mid-write is removed, not left behind for good."""
    run = tmp_path / "outputs" / "2026-12-01" / "10-00-00_gpt"
    engine = small_engine()
    saved_steps(engine, run / "checkpoints", 2)
    (run / "checkpoints" / "step_2" / "engine.pt").unlink()
    killed = run / "checkpoints" / ".tmp_step_3"
    killed.mkdir()
    (killed / "model.pt").write_bytes(b"half")
    found = _resume_auto_logging_warnings(run, caplog)
    assert found == run / "checkpoints" / "step_1"
    assert "skipping step_2: its engine.pt is missing" in caplog.text
    assert "removed .tmp_step_3" in caplog.text and not killed.exists()


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
