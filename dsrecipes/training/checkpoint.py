"""Engine checkpoints on disk: atomic writes, a `latest` pointer, and keep-last-K pruning.

Layout (DeepSpeed-like tags):

    <save_dir>/step_120/model.pt        module state_dict
    <save_dir>/step_120/optimizer.pt    optimizer state_dict
    <save_dir>/step_120/engine.pt       scheduler, counters, RNG states, client_state
    <save_dir>/step_120/config.yaml     the resolved config (when known)
    <save_dir>/latest                   name of the newest complete checkpoint

A checkpoint is written into a hidden temporary directory and renamed into place only when
complete, so a crash mid-save never leaves a half checkpoint under a real tag.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

LATEST = "latest"
_TAG_PATTERN = re.compile(r"^step_(\d+)$")


def write_checkpoint(save_dir: str | os.PathLike, tag: str, files: dict[str, object], config_yaml: str | None) -> Path:
    """Save each {filename: object} with torch.save into <save_dir>/<tag>/, atomically."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    final = save_dir / tag
    tmp = save_dir / f".tmp_{tag}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for name, obj in files.items():
        torch.save(obj, tmp / name)
    if config_yaml is not None:
        (tmp / "config.yaml").write_text(config_yaml)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_text_atomic(save_dir / LATEST, tag)
    return final


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def complete_checkpoints(save_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under save_dir, oldest first (temporary directories excluded)."""
    save_dir = Path(save_dir)
    if not save_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in save_dir.iterdir() if p.is_dir() and (m := _TAG_PATTERN.match(p.name))]
    return [p for _, p in sorted(found)]


def prune_checkpoints(save_dir: str | os.PathLike, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints (0 keeps all); returns what was removed."""
    if keep_last <= 0:
        return []
    doomed = complete_checkpoints(save_dir)[:-keep_last]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def resolve_checkpoint_dir(load_dir: str | os.PathLike, tag: str | None = None) -> Path:
    """The checkpoint directory for `tag`, or the one named by `latest`; a clear error if absent."""
    load_dir = Path(load_dir)
    if tag is None:
        if (load_dir / "model.pt").exists():
            return load_dir
        latest = load_dir / LATEST
        if not latest.exists():
            raise FileNotFoundError(f"no checkpoint in {load_dir}: neither {latest} nor {load_dir / 'model.pt'} exists")
        tag = latest.read_text().strip()
    path = load_dir / tag
    if not (path / "model.pt").exists():
        raise FileNotFoundError(f"checkpoint {path} is missing or incomplete (no model.pt)")
    return path


def read_checkpoint(path: Path, name: str, map_location="cpu"):
    return torch.load(path / name, map_location=map_location, weights_only=False)
