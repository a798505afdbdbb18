"""Offline and off-terminal robustness: no network for local data, fast one-line failures and fallbacks
when the network is gone (mocked here: the machine's own network is not relied on), W&B runs that
resume, plain progress lines off a terminal."""

import time

import pytest

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.training.config import LoggerConfig
from dsrecipes.training.reporting.loggers import MetricLoggers, wandb_run_id
from dsrecipes.training.trainer import Trainer


def wandb_cfg(**kwargs) -> LoggerConfig:
    return LoggerConfig(jsonl=False, tensorboard=False, wandb=True, **kwargs)


def test_wandb_with_a_key_but_no_server_falls_back_to_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens: refused at once
    monkeypatch.delenv("WANDB_MODE", raising=False)
    started = time.monotonic()
    with pytest.warns(UserWarning, match=r"W&B online logging is unavailable \(127.0.0.1:9: ConnectionRefusedError"):
        loggers = MetricLoggers(wandb_cfg(), tmp_path, "run", {})
    loggers.log({"train/loss": 1.0}, 1)
    loggers.close()
    assert time.monotonic() - started < 15
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_a_failing_wandb_init_falls_back_to_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    import dsrecipes.utils.network

    monkeypatch.setattr(dsrecipes.utils.network, "unreachable", lambda url, timeout_s=3.0: None)  # it "answers"
    real_init = wandb.init

    def init(*args, mode=None, **kwargs):
        if mode == "online":
            raise wandb.errors.CommError("Timed out while retrying: Post graphql")
        return real_init(*args, mode=mode, **kwargs)

    monkeypatch.setattr(wandb, "init", init)
    with pytest.warns(UserWarning, match=r"wandb.init failed: CommError: Timed out"):
        loggers = MetricLoggers(wandb_cfg(wandb_mode="online"), tmp_path, "run", {})
    loggers.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))


@pytest.mark.slow
def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, fast_overrides, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    base = fast_overrides + ["logger=wandb", "logger.jsonl=true", "trainer.sample_tokens=0", "trainer.eval_interval=0"]
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    root, batch = validate_recipe(compose(base + ["trainer.max_steps=4"]), dp_world_size=1)
    Trainer(root, first_dir, batch).fit()
    root, batch = validate_recipe(compose(base + ["trainer.max_steps=6",
                                                  f"trainer.resume={first_dir / 'checkpoints'}"]), dp_world_size=1)
    Trainer(root, second_dir, batch).fit()
    assert wandb_run_id(first_dir) is not None
    assert wandb_run_id(second_dir) == wandb_run_id(first_dir)
    (offline_run,) = list((second_dir / "wandb").glob("offline-run-*"))
    assert offline_run.name.endswith(wandb_run_id(first_dir))
