"""The environment of every process a test starts: the test process's own, offline, and without the Triton interpreter.

    subprocess.run([...], env=subprocess_env(OMP_NUM_THREADS="1"))

W&B runs offline and the Hugging Face libraries never reach the network (nothing may download at run time). The
Triton interpreter is for the kernel tests alone (tests/helpers/triton_interpreter.py): a child process never gets
TRITON_INTERPRET, even one started from inside a kernel test, so its kernels take their torch path as a user's
would on a CPU.
"""

from __future__ import annotations

import os

OFFLINE = {"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# never handed to a child: the interpreter (kernel tests only) and a W&B key (the runs stay offline)
WITHHELD = ("TRITON_INTERPRET", "WANDB_API_KEY")


def subprocess_env(base: dict | None = None, **extra: str) -> dict:
    """`base` (default: this process's environment) made offline, without WITHHELD, with `extra` on top."""
    env = {key: value for key, value in (os.environ if base is None else base).items() if key not in WITHHELD}
    env.update(OFFLINE)
    env.update(extra)
    return env
