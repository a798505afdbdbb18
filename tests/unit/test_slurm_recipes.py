"""The SLURM recipes, as far as one machine can run them.

* The shipped sbatch templates (dsrecipes/launch/*.sbatch) run with bash, as sbatch runs them (the
  #SBATCH lines are comments to bash), in a pretend two-node allocation whose nodes are both this
  machine (tests/helpers/fake_slurm.py: fake srun and scontrol). The torchrun form at 2 nodes x 2
  workers, ZeRO-3, reproduces the single-process reference run (tests/helpers/equivalence.py); the
  srun-alone form at 2 nodes x 1 task trains as world 2. Both write one run directory.
* Hydra's submitit launcher through its local executor (hydra/launcher=slurm_local): the job's two
  tasks are the two ranks of one run; and through its SLURM executor (hydra/launcher=slurm) with the
  fake sbatch/sacct: a job of 2 nodes x 1 task is one run at world 2.

Not covered here: real sbatch/srun/sacct (queueing, GPU binding, the environment real SLURM gives a
task beyond the variables faked here), nodes that are different machines (hostname resolution,
network interfaces, a filesystem shared between nodes), GPUs and NCCL.
"""

from __future__ import annotations

import os

import pytest

from dsrecipes.launch.slurm import TEMPLATES, main, template_text


def test_every_template_ships_and_prints(capsys):
    for name, file in TEMPLATES.items():
        text = template_text(name)
        assert text.startswith("#!/bin/bash\n") and "#SBATCH --nodes=" in text and '"$@"' in text, file
        main([name])
        assert capsys.readouterr().out == text


def test_submitit_local_preset_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from dsrecipes.config.store import compose

    cfg = compose(["hydra/launcher=slurm_local"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("LocalLauncher")
    assert cfg.hydra.launcher.tasks_per_node == 2


def _clear_launcher_variables(monkeypatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "placeholder")  # so monkeypatch restores (removes) what the code sets
        monkeypatch.delenv(key)
    for key in [k for k in os.environ if k.startswith(("SLURM_", "SUBMITIT_"))]:
        monkeypatch.delenv(key)


def test_a_submitit_local_job_trains_the_batch_the_local_launcher_trains(monkeypatch):
    """hydra/launcher=slurm_local's 2 tasks stand in for launcher.nproc_per_node=auto's 2 CPU workers: the same
    recipe trains the same global batch under both (it used to be twice as large under slurm_local)."""
    from dsrecipes.config.preflight import check_train_job
    from dsrecipes.config.store import compose

    pytest.importorskip("submitit")
    _clear_launcher_variables(monkeypatch)
    with pytest.warns(UserWarning, match="stays the recipe's 16"):
        _, local, nproc, joined = check_train_job(compose(["zero.stage=2"]))
    assert (nproc, joined) == (2, False)
    for key, value in {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "778", "SUBMITIT_LOCAL_NTASKS": "2",
                       "SUBMITIT_LOCAL_JOB_NUM_NODES": "1", "SUBMITIT_LOCAL_NODEID": "0",
                       "SUBMITIT_LOCAL_GLOBALID": "0", "SUBMITIT_LOCAL_LOCALID": "0"}.items():
        monkeypatch.setenv(key, value)
    with pytest.warns(UserWarning, match=r"hydra/launcher=slurm_local's job runs 2 CPU workers: the global batch "
                                         r"stays the recipe's 16"):
        _, submitit, nproc, joined = check_train_job(compose(["zero.stage=2"]))
    assert (nproc, joined) == (2, True)
    assert (submitit.train_batch_size, submitit.micro_batch_size, submitit.dp_world_size) == \
        (local.train_batch_size, local.micro_batch_size, local.dp_world_size) == (16, 8, 2)


def test_a_submitit_local_task_is_a_rank_of_its_job(monkeypatch):
    """Submitit's local executor sets SUBMITIT_LOCAL_* only (no SLURM_*): task 1 of 2 becomes rank 1 of world 2,
    meeting rank 0 on this host at a port derived from the job id (the same in every task of the job)."""
    import socket

    from dsrecipes.launch.environment import under_launcher

    pytest.importorskip("submitit")
    _clear_launcher_variables(monkeypatch)
    for key, value in {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "777", "SUBMITIT_LOCAL_NTASKS": "2",
                       "SUBMITIT_LOCAL_JOB_NUM_NODES": "1", "SUBMITIT_LOCAL_NODEID": "0",
                       "SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1"}.items():
        monkeypatch.setenv(key, value)
    assert under_launcher()
    assert [os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")] == ["1", "2", "1", "2"]
    assert os.environ["MASTER_ADDR"] == socket.gethostname()
    port = os.environ["MASTER_PORT"]
    for key in ("RANK", "MASTER_PORT"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("SUBMITIT_LOCAL_GLOBALID", "0")
    monkeypatch.setenv("SUBMITIT_LOCAL_LOCALID", "0")
    assert under_launcher() and os.environ["RANK"] == "0" and os.environ["MASTER_PORT"] == port


def test_a_submitit_slurm_task_keeps_the_address_its_setup_exported(monkeypatch):
    from dsrecipes.launch.environment import under_launcher

    pytest.importorskip("submitit")
    _clear_launcher_variables(monkeypatch)
    for key, value in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "99", "SLURM_NTASKS": "16",
                       "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "13", "SLURM_LOCALID": "5",
                       "SLURM_JOB_NODELIST": "gpu[07-08]", "MASTER_ADDR": "gpu07", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    assert under_launcher()
    assert [os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")] \
        == ["13", "16", "5", "8", "gpu07", "29500"]
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("MASTER_ADDR")
    assert under_launcher() and os.environ["MASTER_ADDR"] == "gpu07"  # the job's first node, from the nodelist


def test_a_submitit_job_of_one_task_is_not_a_launcher(monkeypatch):
    from dsrecipes.launch.environment import under_launcher

    pytest.importorskip("submitit")
    _clear_launcher_variables(monkeypatch)
    for key, value in {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "5", "SUBMITIT_LOCAL_NTASKS": "1",
                       "SUBMITIT_LOCAL_GLOBALID": "0", "SUBMITIT_LOCAL_LOCALID": "0"}.items():
        monkeypatch.setenv(key, value)
    assert not under_launcher()  # one task trains alone or spawns its workers (launcher.nproc_per_node)
