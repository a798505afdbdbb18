"""Run the dsrecipes CLI in a subprocess, offline (W&B offline, no Hugging Face network)."""

from __future__ import annotations

import os
import subprocess
import sys


def run_cli(args: list[str], cwd, timeout: int = 240, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m dsrecipes ARGS` in `cwd`; W&B forced offline, no network."""
    env = dict(os.environ, WANDB_MODE="offline", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **(env_extra or {}))
    env.pop("WANDB_API_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "dsrecipes", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
