"""The environment every node gets, as DeepSpeed's runner forwards it to its pdsh/ssh nodes.

Two sources, in this order (a later one wins for the same name), both as in deepspeed/launcher/runner.py:

* the launching shell's variables whose names start with MLFLOW, PYTHON, MV2, UCX or NCCL (DeepSpeed's
  EXPORT_ENVS plus the CUDA accelerator's export_envs); with AISC_JOB_NAME set, NCCL_IB_HCA and
  UCX_NET_DEVICES stay behind (each node sets its own there, DeepSpeed's EXCLUDE_ENVS);
* `.deepspeed_env` (the name DS_ENV_FILE gives, if set) in the home directory, then in the current
  directory: `KEY=VALUE` lines.

Values are written as DeepSpeed writes them: bare when they hold only [A-Za-z0-9_@%+=:,./-], otherwise in
double quotes, so `LD_LIBRARY_PATH=/opt/nccl/lib:$LD_LIBRARY_PATH` expands on the remote node as it does
with DeepSpeed. Unlike DeepSpeed (which stops with Python's unpacking error on them), blank lines and
`#` lines of the file are skipped, and a line without `=` or with a name that is not a shell variable
name is a ValueError naming the file and line. DeepSpeed also puts the launching directory in front of
PYTHONPATH; here every node starts in that directory and runs `-m dsrecipes`, which imports from there
anyway, so PYTHONPATH is forwarded as it is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

EXPORT_PREFIXES = ("MLFLOW", "PYTHON", "MV2", "UCX", "NCCL")
EXCLUDED_WHEN = {"AISC_JOB_NAME": ("NCCL_IB_HCA", "UCX_NET_DEVICES")}
ENV_FILE_NAME = ".deepspeed_env"
ENV_FILE_VARIABLE = "DS_ENV_FILE"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN = re.compile(r"[\w@%+=:,./-]*")


def env_file_paths(environ: Mapping[str, str], home: str | os.PathLike, cwd: str | os.PathLike) -> list[Path]:
    """Where DeepSpeed looks for the file: HOME/<name>, then CWD/<name> (<name>: $DS_ENV_FILE or .deepspeed_env)."""
    name = environ.get(ENV_FILE_VARIABLE, ENV_FILE_NAME)
    return [Path(home) / name, Path(cwd) / name]


def read_env_file(path: str | os.PathLike) -> dict[str, str]:
    """The KEY=VALUE lines of one file (names and values stripped, as DeepSpeed strips them)."""
    variables = {}
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, equals, value = line.partition("=")
        key = key.strip()
        if not equals or not _NAME.fullmatch(key):
            raise ValueError(f"{path} line {number}: {line!r} is not a KEY=VALUE line (KEY a shell variable name); "
                             f"each line of {ENV_FILE_NAME} is exported on every node as KEY=VALUE")
        variables[key] = value.strip()
    return variables


def forwarded_env(environ: Mapping[str, str], home: str | os.PathLike, cwd: str | os.PathLike) -> dict[str, str]:
    """Every variable the nodes get: the launching shell's forwarded ones, then the env files' (see the module)."""
    excluded = {name for trigger, names in EXCLUDED_WHEN.items() if trigger in environ for name in names}
    variables = {key: value.strip() for key, value in environ.items()
                 if key.startswith(EXPORT_PREFIXES) and key not in excluded}
    for path in env_file_paths(environ, home, cwd):
        if path.is_file():
            variables.update(read_env_file(path))
    return variables


def shell_value(value: str) -> str:
    """A value as DeepSpeed's runner writes it into `export KEY=VALUE` (see the module docstring)."""
    if _PLAIN.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def assignments(variables: Mapping[str, str]) -> list[str]:
    """KEY=VALUE words for a shell command line."""
    return [f"{key}={shell_value(value)}" for key, value in variables.items()]
