"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_deepspeed_config.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf

from tests.helpers.cli import run_cli
from tests.unit.test_deepspeed_config import _write

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # if DeepSpeed is imported below: its CPU accelerator


@pytest.mark.slow  # a CLI subprocess that trains: ~30 s on 2 cores
def test_cli_trains_a_deepspeed_config_with_an_override_on_top(tmp_path, fast_overrides):
    ds = {"train_batch_size": 16, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.99]}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2, "warmup_type": "linear"}},
          "tensorboard": {"enabled": False}}
    path = _write(tmp_path, "ds_config", ds)
    run_dir = tmp_path / "run"
    result = run_cli([f"deepspeed_config={path}", *fast_overrides, "trainer.max_steps=2", "trainer.eval_interval=0",
                      "optimizer.lr=0.004", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"DeepSpeed config {path}:" in result.stderr
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    assert cfg.optimizer.lr == 0.004 and list(cfg.optimizer.betas) == [0.9, 0.99]  # the override wins, the rest stays
    assert (cfg.lr_scheduler.name, cfg.trainer.gradient_clipping, cfg.logger.tensorboard) == ("warmup_lr", 0.5, False)
    assert (cfg.trainer.train_batch_size, cfg.trainer.train_micro_batch_size_per_gpu) == (16, 8)
    assert not (run_dir / "tb").exists()
