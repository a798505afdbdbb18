"""Offline and off-terminal robustness: no network for local data, fast one-line failures and fallbacks
when the network is gone (mocked here: the machine's own network is not relied on), W&B runs that
resume, plain progress lines off a terminal."""

import io
import socket
import time

import pytest
from rich.console import Console

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.data import prepare_data
from dsrecipes.training.trainer import Trainer


@pytest.fixture
def no_network(monkeypatch):
    """Every DNS lookup fails (as on a machine without network); the hosts asked for are recorded."""
    asked = []

    def refuse(host, *args, **kwargs):
        asked.append(host)
        raise socket.gaierror(-3, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return asked


def data_config(overrides):
    root, _ = validate_recipe(compose(overrides), dp_world_size=1)
    return root.data


def test_builtin_data_makes_no_network_request(tmp_path, no_network):
    prepare_data(data_config(["data.max_bytes=100000", f"data.cache_dir={tmp_path}"]))  # a fresh cache: a real load
    assert no_network == []


@pytest.mark.parametrize("offline_env", [False, True])
def test_hub_data_offline_fails_fast_in_one_line(tmp_path, no_network, monkeypatch, offline_env):
    import datasets

    if offline_env:
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    cfg = data_config(["data=hub", "data.hub_name=someone/not_cached", f"data.cache_dir={tmp_path}"])
    started = time.monotonic()
    with pytest.raises(ValueError) as err:
        prepare_data(cfg)
    assert time.monotonic() - started < 5
    message = str(err.value)
    assert "\n" not in message and message.startswith("data.hub_name=someone/not_cached: offline (")
    assert "HF_HUB_OFFLINE" in message and str(tmp_path) in message
    assert ("HF_HUB_OFFLINE is set" in message) == offline_env


def test_off_a_terminal_progress_is_a_plain_line_per_log_interval(tmp_path, fast_overrides):
    out = io.StringIO()
    root, batch = validate_recipe(compose(fast_overrides + ["trainer.max_steps=10", "trainer.progress_bar=true",
                                                            "trainer.sample_tokens=0"]), dp_world_size=1)
    Trainer(root, tmp_path, batch, console=Console(file=out)).fit()
    lines = [line for line in out.getvalue().splitlines() if " | loss " in line]
    assert [line.split(" INFO ")[1].split(" | ")[0] for line in lines] == ["step 5/10", "step 10/10"]
    assert "tokens/s | ETA 0:00:00" in lines[-1]
    assert lines[-1] == lines[-1].rstrip()  # not padded to the console width
    assert "step 10/10 | loss " in (tmp_path / "logs" / "rank0.log").read_text()
