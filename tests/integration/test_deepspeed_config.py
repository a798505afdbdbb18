"""DeepSpeed configs in (dsrecipes.config.ds_import): translation, report, refusals, the three entry points.

* round trip: each DeepSpeed config of tests/helpers/ds_round_trip.py, through the CLI's
  composition (`deepspeed_config=PATH`), equals its hand-written experiment; together they give
  every key the catalog calls mapped; convert_ds_config's YAML composes to the same config;
* the batch triple against DeepSpeed's own DeepSpeedConfig (fake world size 1/2/4), also under a
  recipe that sets batch keys of its own (a default never counts as given);
* "auto" as Hugging Face's integration resolves it; refused keys, each named in one ValueError;
  the report lists every key of the config;
* load_config / dsrecipes.initialize with a .json path, a DeepSpeed dict, and `deepspeed_config`
  beside dsrecipes keys (those win); one CLI subprocess with an override on top winning;
* the key tables against DeepSpeed's pydantic config models (where DeepSpeed is installed).
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
