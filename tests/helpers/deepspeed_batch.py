"""DeepSpeed's own batch triple, as the oracle of the batch-rule tests (test_deepspeed_parity, test_deepspeed_config)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


def deepspeed_batch(config: dict, world: int, monkeypatch):
    """DeepSpeedConfig's (train, micro, accumulation) for `config` at data-parallel size `world`, or None if it asserts."""
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_config

    # DeepSpeedConfig reads the world size from deepspeed.comm, which needs a process group: stand one in
    monkeypatch.setattr(ds_config, "dist", SimpleNamespace(get_rank=lambda *a, **k: 0,
                                                           get_world_size=lambda *a, **k: world))
    try:
        c = ds_config.DeepSpeedConfig(dict(config))
    except AssertionError:
        return None
    return c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps
