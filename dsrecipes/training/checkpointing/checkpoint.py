"""Engine checkpoints on disk: atomic writes, a verified manifest, a `latest` pointer, keep-last-K pruning.

Layout (DeepSpeed-like tags):

    <save_dir>/step_120/dcp/            model + optimizer via torch.distributed.checkpoint (sharded,
                                        world-size independent), or, for the setups DCP cannot
                                        describe (ZeRO-1, fp32 master weights):
    <save_dir>/step_120/model.pt        full-precision module state_dict
    <save_dir>/step_120/optimizer.pt    optimizer state_dict
    <save_dir>/step_120/engine.pt       scheduler, loss scaler, counters, client_state
    <save_dir>/step_120/rng_rank<R>.pt  RNG states of each rank
    <save_dir>/step_120/config.yaml     the resolved config (when known)
    <save_dir>/step_120/manifest.json   every other file's size and CRC-32, written last
    <save_dir>/latest                   name of the newest complete checkpoint

A checkpoint is written into a hidden temporary directory and renamed into place only when every
rank has finished, so a crash mid-save never leaves a half checkpoint under a real tag. A write
that fails on any rank (disk full, a read-only or vanished directory) fails the save on every rank
at once with one message, removes the temporary directory and leaves the earlier checkpoints as
they were; stale temporary directories of a killed run are removed by the next save or `trainer.resume=auto`.
Loading verifies the manifest and names the file that does not match; `trainer.resume=auto` passes over a
checkpoint that fails verification or lost its engine.pt (with a warning naming it) and takes the one before it.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import zipfile
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions

from dsrecipes.distributed.utils import errors_of_every_rank, rank_zero_result

LATEST = "latest"
COMPLETE_MARKER = "engine.pt"  # written by the writing rank after every rank's files
MANIFEST = "manifest.json"  # written last: sizes and CRC-32s of the other files
_TAG_PATTERN = re.compile(r"^step_(\d+)$")
_TMP_PREFIX = ".tmp_"
_CHUNK = 8 << 20

log = logging.getLogger("dsrecipes")


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (disk full, read-only or vanished directory); nothing was renamed into place.

    An OSError, so the entry points report it as the user's to fix (dsrecipes.utils.errors.USER_ERRORS).
    """


def begin_checkpoint(save_dir: str | os.PathLike, tag: str, is_writer: bool, expected_bytes: int = 0) -> Path:
    """Create (on the writing rank) the hidden temporary directory every rank then writes into.

    The writer first removes temporary directories left by a killed save and checks that about
    expected_bytes are free; any failure there is raised on every rank (CheckpointSaveError).
    """
    save_dir = Path(save_dir)
    tmp = save_dir / f"{_TMP_PREFIX}{tag}"
    error = None
    if is_writer:
        try:
            save_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(save_dir)
            check_free_space(save_dir, expected_bytes)
            tmp.mkdir()
        except OSError as failure:  # CheckpointSaveError (the free-space check) included
            error = describe_write_error(failure)
    raise_if_any_rank_failed(error, save_dir, tag, tmp, is_writer)
    return tmp


def raise_if_any_rank_failed(local_error: str | None, save_dir: Path, tag: str, tmp: Path, is_writer: bool) -> None:
    """Every rank learns whether any rank failed its part of the save; then all raise, the writer cleaning up first."""
    errors = errors_of_every_rank(local_error)
    if not errors:
        return
    if is_writer:
        shutil.rmtree(tmp, ignore_errors=True)
    newest = _newest_in(Path(save_dir), verify=False) if is_writer else None
    kept = f"the newest complete checkpoint is still {newest}" if newest else "no earlier checkpoint exists"
    raise CheckpointSaveError(f"checkpoint {tag} could not be saved in {save_dir} ({'; '.join(errors)}); {kept}")


def save_file(obj, path: Path) -> None:
    """torch.save into an open file, so that a full or vanished disk is the OSError it is.

    torch.save given a path reports a short write as "unexpected pos N vs M"; through a Python file
    the OSError (ENOSPC, EROFS, ...) is the RuntimeError's context, and is raised instead, naming the file.
    """
    with open(path, "wb") as handle:
        try:
            torch.save(obj, handle)
        except RuntimeError as error:
            if isinstance(error.__context__, OSError):
                cause = error.__context__
                raise OSError(cause.errno, cause.strerror, str(path)) from None
            raise


def describe_write_error(error: BaseException) -> str:
    """One line for a failed write: the OS's reason and the path it concerns."""
    if isinstance(error, OSError) and error.strerror:
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror}{where}"
    return str(error) or type(error).__name__


def check_free_space(save_dir: Path, expected_bytes: int) -> None:
    """Refuse a save that would not fit: about expected_bytes (and 5% more) must be free on save_dir's disk."""
    if expected_bytes <= 0:
        return
    free = shutil.disk_usage(save_dir).free
    if free < expected_bytes * 1.05:
        raise CheckpointSaveError(
            f"not enough free space on {save_dir}: the checkpoint needs about {_human(expected_bytes)}, "
            f"{_human(free)} are free (free some space, or point hydra.run.dir / checkpoint.dirname elsewhere)"
        )


def _human(size: float) -> str:
    units, index = ("bytes", "KiB", "MiB", "GiB", "TiB"), 0
    while size >= 1024 and index < len(units) - 1:
        size, index = size / 1024, index + 1
    return f"{size:.0f} bytes" if index == 0 else f"{size:.2f} {units[index]}"


def remove_stale_temporaries(save_dir: Path) -> list[Path]:
    """Delete the hidden temporary directories a killed or failed save left behind; returns what was removed."""
    stale = [p for p in save_dir.iterdir() if p.is_dir() and p.name.startswith(_TMP_PREFIX)] if save_dir.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def checkpoint_bytes(path: Path) -> int:
    """Total size of the files of a checkpoint directory."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def finish_checkpoint(save_dir: str | os.PathLike, tag: str, is_writer: bool, keep_last: int) -> Path:
    """After every rank wrote its part: manifest, rename into place, point `latest` at it, prune old ones."""
    save_dir = Path(save_dir)
    final = save_dir / tag
    tmp = save_dir / f"{_TMP_PREFIX}{tag}"
    error = None
    if is_writer:
        try:
            write_manifest(tmp)
            _replace_directory(tmp, final)
            _write_text_atomic(save_dir / LATEST, tag)
        except OSError as failure:
            error = describe_write_error(failure)
    raise_if_any_rank_failed(error, save_dir, tag, tmp, is_writer)
    if is_writer:
        prune_checkpoints(save_dir, keep_last)
    barrier()
    return final


def _replace_directory(new: Path, final: Path) -> None:
    """Rename new to final; an existing final (the same tag saved again) is moved aside first and deleted last."""
    aside = final.with_name(f"{_TMP_PREFIX}{final.name}.old")
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    os.replace(new, final)
    shutil.rmtree(aside, ignore_errors=True)


def write_manifest(folder: Path) -> None:
    """<folder>/manifest.json: every file's size and CRC-32, written atomically after all of them."""
    files = {
        str(f.relative_to(folder)): {"size": f.stat().st_size, "crc32": _crc32(f)}
        for f in sorted(folder.rglob("*")) if f.is_file() and f.name != MANIFEST
    }
    _write_text_atomic(folder / MANIFEST, json.dumps({"format": 1, "files": files}, indent=1))


def _crc32(file: Path) -> str:
    import zlib

    value = 0
    with open(file, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            value = zlib.crc32(chunk, value)
    return f"{value:08x}"


_VERIFIED: dict[tuple[str, float], None] = {}


def verify_checkpoint(path: Path) -> None:
    """Check every file the manifest lists: present, same size, same CRC-32; a ValueError naming the first that is not.

    Checkpoints written before manifests existed (engine.pt, no manifest.json) pass unverified.
    A checkpoint that passed is not read again in this process.
    """
    path = Path(path)
    manifest_file = path / MANIFEST
    if not manifest_file.exists():
        return
    key = (str(manifest_file.resolve()), manifest_file.stat().st_mtime)
    if key in _VERIFIED:
        return
    try:
        listed = json.loads(manifest_file.read_text())["files"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"checkpoint {path} failed verification: {MANIFEST} is unreadable ({error})") from None
    failed = f"checkpoint {path} failed verification:"
    for name, expected in listed.items():
        file = path / name
        if not file.is_file():
            raise ValueError(f"{failed} {name} is missing")
        size = file.stat().st_size
        if size != expected["size"]:
            raise ValueError(f"{failed} {name} has {size} bytes, the manifest says {expected['size']}")
        if _crc32(file) != expected["crc32"]:
            raise ValueError(f"{failed} {name} does not match its checksum (corrupt or overwritten)")
    _VERIFIED[key] = None


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
            verify_checkpoint(load_dir)
            return load_dir
        latest = load_dir / LATEST
        if not latest.exists():
            raise FileNotFoundError(f"no checkpoint in {load_dir}: neither {latest} nor {load_dir / COMPLETE_MARKER} exists")
        tag = latest.read_text().strip()
    path = load_dir / tag
    if not (path / COMPLETE_MARKER).exists():
        raise FileNotFoundError(f"checkpoint {path} is missing or incomplete (no {COMPLETE_MARKER})")
    verify_checkpoint(path)
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


def _newest_in(save_dir: Path, verify: bool = True) -> Path | None:
    """The newest complete checkpoint in save_dir: `latest` if it points at one, else the highest step.

    With verify, a checkpoint that fails verification, or whose completion marker (engine.pt) is gone, is passed
    over with a warning for the one before it, and the temporary directories a killed save left are removed.
    """
    tagged = complete_checkpoints(save_dir)  # oldest first
    marked = [(p / COMPLETE_MARKER).exists() for p in tagged]
    candidates = [p for p, complete in zip(tagged, marked) if complete][::-1]
    if verify:
        newest_marked = max((i for i, complete in enumerate(marked) if complete), default=-1)
        for unmarked in tagged[newest_marked + 1:]:  # newer than every complete one: what resume would have taken
            log.warning("resume: skipping %s: its %s is missing, so it is not a complete checkpoint",
                        unmarked.name, COMPLETE_MARKER)
        for stale in remove_stale_temporaries(save_dir):
            log.warning("resume: removed %s, the temporary directory of a save that was killed", stale.name)
    latest = save_dir / LATEST
    if latest.exists():
        pointed = save_dir / latest.read_text().strip()
        if pointed in candidates:
            candidates.remove(pointed)
            candidates.insert(0, pointed)
    for candidate in candidates:
        if not verify:
            return candidate
        try:
            verify_checkpoint(candidate)
            return candidate
        except ValueError as error:
            log.warning("resume: skipping %s: %s", candidate.name, error)
    return None


def newest_checkpoint(save_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under save_dir (not verified), or None."""
    return _newest_in(Path(save_dir), verify=False)


def find_resume_checkpoint(spec: str, run_dir: Path, dirname: str, run_name: str) -> Path | None:
    """Where `trainer.resume=<spec>` resumes from (chosen on rank 0, the same on every rank).

    spec "auto": the newest complete checkpoint of this run directory that passes verification,
    else of the most recent earlier run directory with the same name beside it
    (outputs/<date>/<time>_<name>/, so re-running the same command after a preemption continues),
    else None (a fresh start). Any other spec is a checkpoint directory, or a folder holding
    `latest` / step_N checkpoints, and must exist and pass verification; or a checkpoint written by
    DeepSpeed (its folder with `latest`, or a global_stepN folder), read by dsrecipes.training.checkpointing.deepspeed_checkpoint.
    """
    return rank_zero_result(lambda: _find_resume_checkpoint(spec, Path(run_dir), dirname, run_name))


def _find_resume_checkpoint(spec: str, run_dir: Path, dirname: str, run_name: str) -> Path | None:
    if spec != "auto":
        path = Path(spec)
        from dsrecipes.training.checkpointing.deepspeed_checkpoint import looks_like_deepspeed_checkpoint, resolve_deepspeed_dir

        if looks_like_deepspeed_checkpoint(path):  # written by DeepSpeed: its `latest`, or a global_stepN folder
            return resolve_deepspeed_dir(path)
        if (path / COMPLETE_MARKER).exists():
            verify_checkpoint(path)
            return path
        for folder in (path, path / dirname):
            found = _newest_in(folder, verify=False) if folder.is_dir() else None
            if found is not None:
                verify_checkpoint(found)
                return found
        raise FileNotFoundError(f"trainer.resume={spec!r}: no complete checkpoint found there")
    found = _newest_in(run_dir / dirname)
    if found is not None:
        return found
    outputs_root = run_dir.parent.parent
    if run_dir.parent.parent.name == "multirun" or run_dir.parent.name.isdigit():
        return None  # sweep jobs resume only from their own directory
    earlier = sorted((f for f in outputs_root.glob(f"*/*_{run_name}") if f != run_dir and (f / dirname).is_dir()),
                     key=lambda f: (f / dirname).stat().st_mtime, reverse=True)
    for folder in earlier:
        if (found := _newest_in(folder / dirname)) is not None:
            return found
    return None


# the state-dict options of every DCP-checkpointed strategy: optimizer state keyed by parameter name (flattened)
SHARDED_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def drop_optimizer_state(engine, names: set[str]) -> None:
    """Forget the optimizer state (moments, step) of the named parameters: a checkpoint that has none for them
    leaves them as freshly initialised, as at the first step, instead of with the values set_state_dict left."""
    for name, param in engine.strategy.state_module.named_parameters(remove_duplicate=False):
        if name in names:
            engine.optimizer.state.pop(param, None)
