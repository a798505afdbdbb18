"""Data parallelism and ZeRO 0-3 (+offload) at world size 2 on CPU/gloo reproduce the single process.

Every run goes through the real CLI: `python -m dsrecipes launcher.nproc_per_node=2 ...` spawns two
workers with torch's elastic agent. Same global batch (1 x 8 x 2 vs 2 x 4 x 2), gradient
accumulation 2, clipping at 1.0, fp32, no dropout (dropout masks would differ per rank).

Tolerance: losses within 2e-5 absolute and final parameters within 5e-5 over 10 steps. The only
difference is fp32 summation order (two half-batch gradients averaged across ranks instead of one
batch, sharded reduce-scatter under FSDP2), about 1e-7 relative per step; Adam's normalisation
lets it grow slowly over the steps, so the bound leaves ~100x room while still catching any real
error (a wrong loss scaling or a missing gradient shard moves the loss by > 1e-2).
"""


import pytest


def test_slurm_tasks_join_as_ranks(monkeypatch):
    from dsrecipes.launch.workers import under_launcher

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.setenv(key, "placeholder")  # so monkeypatch restores (removes) what the code sets
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4(x2)")
    assert under_launcher()
    import os

    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"]) == \
        ("5", "8", "1", "4")


def test_submitit_slurm_preset_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from dsrecipes.config.store import compose

    cfg = compose(["hydra/launcher=slurm"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.tasks_per_node == 8
