"""Checks of the directories a run writes to, before it writes anything."""

from __future__ import annotations

import os
import tempfile


def check_writable_dir(key: str, path: str) -> None:
    """key=path must be a writable directory, or one that can be created (its nearest existing parent writable).

    Permission bits are not the whole answer (root passes os.access everywhere, and /proc or a full or read-only
    mount refuses a new directory anyway), so the directory that would hold the run also gets a probe: a scratch
    subdirectory made and removed at once."""
    target = os.path.abspath(os.path.expanduser(str(path)))
    if os.path.exists(target):
        if not os.path.isdir(target):
            raise ValueError(f"{key}={path!r} is not valid: {target!r} is a file, not a directory")
        if not os.access(target, os.W_OK | os.X_OK):
            raise ValueError(f"{key}={path!r} is not valid: the directory {target!r} is not writable")
        _probe(key, path, target)
        return
    parent = os.path.dirname(target)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{key}={path!r} is not valid: {parent!r} is a file, so no directory can be created under it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{key}={path!r} is not valid: it does not exist and {parent!r} is not writable")
    _probe(key, path, parent)


def _probe(key: str, path: str, directory: str) -> None:
    """ValueError naming key=path unless a subdirectory can be created in `directory` (removed again at once)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".dsrecipes-probe-", dir=directory))
    except OSError as error:
        raise ValueError(f"{key}={path!r} is not valid: no directory can be created in {directory!r} "
                         f"({error.strerror or error})") from None
