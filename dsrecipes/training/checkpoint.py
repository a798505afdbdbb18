"""Engine checkpoints on disk: atomic writes, a `latest` pointer, and keep-last-K pruning.

Layout (DeepSpeed-like tags):

    <save_dir>/step_120/dcp/            model + optimizer via torch.distributed.checkpoint (sharded,
                                        world-size independent), or, for the setups DCP cannot
                                        describe (ZeRO-1, fp32 master weights):
    <save_dir>/step_120/model.pt        full-precision module state_dict
    <save_dir>/step_120/optimizer.pt    optimizer state_dict
    <save_dir>/step_120/engine.pt       scheduler, loss scaler, counters, client_state
    <save_dir>/step_120/rng_rank<R>.pt  RNG states of each rank
    <save_dir>/step_120/config.yaml     the resolved config (when known)
    <save_dir>/latest                   name of the newest complete checkpoint

A checkpoint is written into a hidden temporary directory and renamed into place only when every
rank has finished, so a crash mid-save never leaves a half checkpoint under a real tag.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import zipfile
from pathlib import Path

import torch

LATEST = "latest"
COMPLETE_MARKER = "engine.pt"  # written last by the writing rank; renaming makes the whole directory appear at once
_TAG_PATTERN = re.compile(r"^step_(\d+)$")


def begin_checkpoint(save_dir: str | os.PathLike, tag: str, is_writer: bool) -> Path:
    """Create (on the writing rank) the hidden temporary directory every rank then writes into."""
    save_dir = Path(save_dir)
    tmp = save_dir / f".tmp_{tag}"
    if is_writer:
        save_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    barrier()
    return tmp


def finish_checkpoint(save_dir: str | os.PathLike, tag: str, is_writer: bool, keep_last: int) -> Path:
    """After every rank wrote its part: rename into place, point `latest` at it, prune old ones."""
    save_dir = Path(save_dir)
    final = save_dir / tag
    barrier()
    if is_writer:
        if final.exists():
            shutil.rmtree(final)
        os.replace(save_dir / f".tmp_{tag}", final)
        _write_text_atomic(save_dir / LATEST, tag)
        prune_checkpoints(save_dir, keep_last)
    barrier()
    return final


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


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
        if (load_dir / COMPLETE_MARKER).exists():
            return load_dir
        latest = load_dir / LATEST
        if not latest.exists():
            raise FileNotFoundError(f"no checkpoint in {load_dir}: neither {latest} nor {load_dir / COMPLETE_MARKER} exists")
        tag = latest.read_text().strip()
    path = load_dir / tag
    if not (path / COMPLETE_MARKER).exists():
        raise FileNotFoundError(f"checkpoint {path} is missing or incomplete (no {COMPLETE_MARKER})")
    return path


def read_checkpoint(path: Path, name: str, map_location="cpu"):
    """torch.load one file of a checkpoint; a truncated or corrupt file is a ValueError naming it."""
    file = path / name
    if not file.exists():
        raise FileNotFoundError(f"checkpoint {path} is incomplete: {name} is missing")
    try:
        return torch.load(file, map_location=map_location, weights_only=False)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        raise ValueError(f"checkpoint file {file} is truncated or corrupt ({error}); load an older checkpoint") from error


def check_state_dict_matches(expected: dict, loaded: dict, source: Path, allow_extra: bool = False) -> None:
    """Refuse partial or mismatched loads: every tensor present, none extra (unless allow_extra: a
    pipeline stage reading its part of a whole-model checkpoint), every shape equal."""
    missing = [k for k in expected if k not in loaded]
    unexpected = [] if allow_extra else [k for k in loaded if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected tensors: {', '.join(unexpected[:5])}{' ...' if len(unexpected) > 5 else ''}")
        raise ValueError(f"checkpoint {source} does not match the model ({'; '.join(parts)}); nothing was loaded")
    for name, tensor in expected.items():
        stored = _shape(loaded[name])
        if stored != tuple(tensor.shape):
            raise ValueError(
                f"checkpoint {source} does not match the model: tensor {name!r} has shape "
                f"{stored} in the checkpoint but {tuple(tensor.shape)} in the model; nothing was loaded"
            )


def _shape(entry) -> tuple:
    """Shape of a tensor, or of a tensor described by torch.distributed.checkpoint metadata."""
    return tuple(entry.shape) if hasattr(entry, "shape") else tuple(entry.size)


def _newest_in(save_dir: Path) -> Path | None:
    """The newest complete checkpoint in save_dir: `latest` if it points at one, else the highest step."""
    latest = save_dir / LATEST
    if latest.exists():
        candidate = save_dir / latest.read_text().strip()
        if (candidate / COMPLETE_MARKER).exists():
            return candidate
    complete = [p for p in complete_checkpoints(save_dir) if (p / COMPLETE_MARKER).exists()]
    return complete[-1] if complete else None


def find_resume_checkpoint(spec: str, run_dir: Path, dirname: str, run_name: str) -> Path | None:
    """Where `trainer.resume=<spec>` resumes from.

    spec "auto": the newest complete checkpoint of this run directory, else of the most recent
    earlier run directory with the same name beside it (outputs/<date>/<time>_<name>/, so re-running
    the same command after a preemption continues), else None (a fresh start).
    Any other spec is a checkpoint directory, or a folder holding `latest` / step_N checkpoints,
    and must exist.
    """
    if spec != "auto":
        path = Path(spec)
        if (path / COMPLETE_MARKER).exists():
            return path
        for folder in (path, path / dirname):
            found = _newest_in(folder) if folder.is_dir() else None
            if found is not None:
                return found
        raise FileNotFoundError(f"trainer.resume={spec!r}: no complete checkpoint found there")
    found = _newest_in(run_dir / dirname)
    if found is not None:
        return found
    outputs_root = run_dir.parent.parent
    if run_dir.parent.parent.name == "multirun" or run_dir.parent.name.isdigit():
        return None  # sweep jobs resume only from their own directory
    candidates = [
        c for folder in outputs_root.glob(f"*/*_{run_name}") if folder != run_dir
        if (c := _newest_in(folder / dirname)) is not None
    ]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None
