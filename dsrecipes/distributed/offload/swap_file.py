"""Scratch swap files on the NVMe path: created per run and rank, gone when the process ends.

A swap file is opened, preallocated to its full size (posix_fallocate, so a full disk fails at
start-up, not in the middle of a step) and unlinked at once: the directory entry disappears while the
open descriptor keeps the data, and the kernel frees the blocks when the descriptor is closed or the
process ends, however it ends (an exception, SIGKILL, an out-of-memory kill). So no swap file can
outlive its run. The file is opened with O_DIRECT where the file system accepts it (see aio.py), and
buffered otherwise.

`check_nvme_path` is the start-up check the recipe validation runs before any worker starts: the
path exists, is a writable directory, and has the free space the run's swap files need.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from dsrecipes.distributed.offload.aio import ALIGNMENT, align_up


def check_nvme_path(path: str | None, need_bytes: int, key: str = "zero.nvme_path") -> None:
    """Raise ValueError naming `key` unless `path` is an existing writable directory with need_bytes free."""
    if not path:
        raise ValueError(f"{key} is not set: NVMe offload (zero.offload_optimizer / zero.offload_param = nvme) "
                         "needs a directory on a fast local disk for its swap files, e.g. zero.nvme_path=/local_nvme")
    if not os.path.isdir(path):
        raise ValueError(f"{key}={path!r} does not exist or is not a directory")
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise ValueError(f"{key}={path!r} is not writable ({error.strerror})") from None
    free = shutil.disk_usage(path).free
    if free < need_bytes:
        raise ValueError(f"{key}={path!r} has {free / 2**30:.2f} GiB free but this run's swap files need "
                         f"{need_bytes / 2**30:.2f} GiB (all ranks of this node together); free space, or "
                         "choose another path")


class SwapFile:
    """One preallocated, already-unlinked scratch file of `nbytes` (rounded up to ALIGNMENT) in `directory`."""

    def __init__(self, directory: str, name: str, nbytes: int, direct: bool = True):
        self.nbytes = align_up(max(nbytes, 1), ALIGNMENT)
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, name)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
        self.direct = False
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.fd = os.open(self.path, flags | os.O_DIRECT, 0o600)
                self.direct = True
            except OSError:  # the file system refuses O_DIRECT (tmpfs, some network file systems)
                self.fd = os.open(self.path, flags, 0o600)
        else:
            self.fd = os.open(self.path, flags, 0o600)
        try:
            os.posix_fallocate(self.fd, 0, self.nbytes)
        except OSError as error:
            self.close()
            raise OSError(f"cannot reserve {self.nbytes / 2**20:.1f} MiB for the swap file {self.path}: "
                          f"{error.strerror}") from None
        finally:
            if os.path.exists(self.path):
                os.unlink(self.path)  # scratch: freed by the kernel when fd closes or the process ends

    def size_on_disk(self) -> int:
        """Bytes the file occupies (st_blocks: preallocated space counts)."""
        return os.fstat(self.fd).st_blocks * 512

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def swap_directory(nvme_path: str, rank: int) -> str:
    """Where this process's swap files are opened (then unlinked): one directory per run attempt and rank."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return os.path.join(nvme_path, f"dsrecipes-swap-{run}-{attempt}", f"rank{rank}-pid{os.getpid()}")


def remove_empty_directories(directory: str, stop: str) -> None:
    """Remove `directory` and its empty parents up to (not including) `stop`; non-empty ones stay."""
    directory, stop = os.path.abspath(directory), os.path.abspath(stop)
    while directory.startswith(stop) and directory != stop:
        try:
            os.rmdir(directory)
        except OSError:
            return
        directory = os.path.dirname(directory)
