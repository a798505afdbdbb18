"""One training run per configuration for the whole pytest run, shared across test modules and xdist workers.

    run = cached_run(tmp_path_factory, overrides)    # `python -m dsrecipes OVERRIDES`, once per distinct recipe
    run.losses, run.params, run.metric("val/loss"), run.layout, run.checkpoint(5)

The first test that asks for a recipe trains it through the real CLI (tests/helpers/cli.py) in a folder of the
session's shared temporary directory (the parent of every xdist worker's own); a test on the other worker asking
for the same recipe meanwhile waits on the recipe's file lock and then reads the same run. So the layout-
equivalence table's single-process references run once per model/precision, and a layout's equivalence check
and its resume check read one run. The key is the recipe's overrides as a set (one value per key, so their order
cannot matter), without data.cache_dir, which only says where the tokenized corpus is cached.

A run that fails is recorded with its exit status and the end of its stderr, and every test reading it fails with
them, instead of each retrying it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from filelock import FileLock

from tests.helpers.cli import run_cli


def shared_root(tmp_path_factory) -> Path:
    """The session's temporary directory shared by every xdist worker (each worker's basetemp is a child of it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_datasets_cache(tmp_path_factory) -> str:
    """One datasets cache for every test process of the run: the corpus is tokenized once, not once per worker."""
    folder = shared_root(tmp_path_factory) / "hf_datasets_cache"
    folder.mkdir(exist_ok=True)
    return str(folder)


def _key(overrides: list[str]) -> str:
    keys = [o.split("=", 1)[0] for o in overrides if "=" in o]
    duplicated = sorted({k for k in keys if keys.count(k) > 1})
    assert not duplicated, f"a cached recipe sets each key once (order would matter): {duplicated} in {overrides}"
    canonical = sorted(o for o in overrides if not o.startswith("data.cache_dir="))
    return hashlib.sha1("\n".join(canonical).encode()).hexdigest()[:16]


@dataclass
class Run:
    """A finished training run: its working folder and run directory, read lazily."""

    folder: Path  # the command's working directory (its run directory is under outputs/)
    overrides: list[str] = field(default_factory=list)

    @cached_property
    def run_dir(self) -> Path:
        (run_dir,) = [p for p in (self.folder / "outputs").glob("*/*") if p.is_dir()]
        return run_dir

    @cached_property
    def records(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]

    def metric(self, key: str) -> list[float]:
        """Every logged value of `key` ("train/loss", "val/loss", "train/moe_aux_loss" ...), in order."""
        return [r[key] for r in self.records if key in r]

    @property
    def losses(self) -> list[float]:
        return self.metric("train/loss")

    @cached_property
    def params(self) -> dict:
        """The run's final export as a state dict: dsrecipes' GPT through load_exported, or, for a transformers-path
        model (model.style=hf), the save_pretrained directory's own tensors under their Hugging Face names."""
        from dsrecipes.models import load_exported

        export = self.run_dir / "export"
        if json.loads((export / "config.json").read_text()).get("model_type") and not _native(export):
            from safetensors.torch import load_file

            return {name: tensor for file in sorted(export.glob("*.safetensors")) for name, tensor in load_file(file).items()}
        model, _ = load_exported(export)
        return model.state_dict()

    @property
    def layout(self) -> str:
        """The layout line the run reported (summary.json, dsrecipes.training.layout)."""
        return json.loads((self.run_dir / "summary.json").read_text())["layout"]

    def checkpoint(self, step: int) -> Path:
        path = self.run_dir / "checkpoints" / f"step_{step}"
        assert path.is_dir(), f"the run saved no step-{step} checkpoint: {sorted(p.name for p in path.parent.iterdir())}"
        return path


def _native(export: Path) -> bool:
    """Whether dsrecipes' GPT loads this Hugging Face export (its model_type has a native form)."""
    from dsrecipes.models.hf_config import NATIVE_MODEL_TYPES

    return json.loads((export / "config.json").read_text())["model_type"] in NATIVE_MODEL_TYPES


def cached_run(tmp_path_factory, overrides: list[str], timeout: int = 300) -> Run:
    """The run of `python -m dsrecipes OVERRIDES`: trained by the first test that asks, read by every later one.
    `model.path=@hf:ARCH` names a tiny Hugging Face checkpoint of tests/helpers/hf_models.py (made on first use);
    the key keeps the placeholder, so it does not depend on where the session's checkpoints live."""
    from tests.helpers.hf_models import resolve_checkpoints

    key = _key(overrides)
    root = shared_root(tmp_path_factory) / "run_cache"
    root.mkdir(exist_ok=True)
    folder, result_file = root / key, root / f"{key}.json"
    with FileLock(str(root / f"{key}.lock")):
        if not result_file.exists():
            folder.mkdir(exist_ok=True)
            command = resolve_checkpoints(list(overrides), tmp_path_factory)
            if not any(o.startswith("data.cache_dir=") for o in command):
                command.append(f"data.cache_dir={shared_datasets_cache(tmp_path_factory)}")
            try:
                result = run_cli(command, cwd=folder, timeout=timeout)
                returncode, stderr = result.returncode, result.stderr[-4000:]
            except subprocess.TimeoutExpired as timed_out:
                said = timed_out.stderr or ""
                said = said.decode(errors="replace") if isinstance(said, bytes) else said
                returncode, stderr = "timeout", f"killed after {timeout} s (a hang?); its stderr ended:\n{said[-12000:]}"
            result_file.write_text(json.dumps({"overrides": list(overrides), "returncode": returncode,
                                               "stderr": stderr}))
    recorded = json.loads(result_file.read_text())
    assert recorded["returncode"] == 0, (f"`python -m dsrecipes {' '.join(overrides)}` failed "
                                         f"(exit {recorded['returncode']}):\n{recorded['stderr']}")
    return Run(folder, list(overrides))
