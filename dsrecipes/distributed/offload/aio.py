"""Asynchronous positional file I/O for NVMe offload: a thread pool of preadv/pwritev into aligned buffers.

Why a thread pool: os.preadv / os.pwritev release the GIL, so reads and writes run beside the
training step's compute with nothing but the standard library. Python has no well-kept libaio
binding (DeepSpeed's async_io is a DeepSpeed C++ extension, and torch's GPUDirect Storage API
needs CUDA and cuFile), so this is written here. Files are opened with O_DIRECT where the file
system allows it, which bypasses the page cache: the bandwidth measured is the disk's, and swapped
state does not come back as cached host memory. O_DIRECT needs the buffer address, the file offset
and the length aligned to ALIGNMENT bytes: `aligned_buffer` and the swap-file layout guarantee it.

DeepSpeed's `aio` keys map as:
  block_size      a request is split into block_size-byte blocks;
  queue_depth     blocks submitted together: one vectored preadv/pwritev call covers up to queue_depth
                  consecutive blocks (what one io_submit batch of libaio does);
  thread_count    threads in the pool, each running its calls (DeepSpeed's intra-op parallelism);
  single_submit   true: one block per call instead of queue_depth;
  overlap_events  false: the swappers wait for every request as soon as it is issued (no prefetch or
                  write-behind), read from `AsyncIO.overlap`.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from dsrecipes.distributed.config import AioConfig
from dsrecipes.distributed.offload.plan import ALIGNMENT, align_up

__all__ = ["ALIGNMENT", "AsyncIO", "Request", "align_up", "aligned_buffer"]

def aligned_buffer(nbytes: int, pin_memory: bool = False) -> torch.Tensor:
    """A uint8 CPU tensor of nbytes (rounded up to ALIGNMENT) whose address is ALIGNMENT-aligned."""
    nbytes = align_up(max(nbytes, 1))
    raw = torch.empty(nbytes + ALIGNMENT, dtype=torch.uint8, pin_memory=pin_memory)
    shift = (-raw.data_ptr()) % ALIGNMENT
    return raw[shift:shift + nbytes]


def _memoryview(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview over a contiguous CPU tensor's bytes (no copy, no numpy)."""
    nbytes = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


class Request:
    """One read or write in flight: wait() blocks until every chunk is done and re-raises an I/O error."""

    def __init__(self, futures: list[Future], nbytes: int):
        self.futures = futures
        self.nbytes = nbytes

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def wait(self) -> None:
        for future in self.futures:
            future.result()


class AsyncIO:
    """Reads and writes of contiguous CPU tensors at byte offsets of open files, in background threads."""

    def __init__(self, cfg: AioConfig | None = None):
        self.cfg = cfg or AioConfig()
        self._pool = ThreadPoolExecutor(max_workers=self.cfg.thread_count, thread_name_prefix="dsrecipes-aio")
        self.bytes_read = 0
        self.bytes_written = 0
        self.busy_s = 0.0  # wall time with at least one transfer in flight (the bandwidth's denominator)
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0

    @property
    def overlap(self) -> bool:
        return self.cfg.overlap_events

    def read(self, fd: int, tensor: torch.Tensor, offset: int) -> Request:
        """Fill `tensor` (contiguous, CPU) from `fd` starting at byte `offset`."""
        self.bytes_read += tensor.numel() * tensor.element_size()
        return self._submit(os.preadv, fd, tensor, offset)

    def write(self, fd: int, tensor: torch.Tensor, offset: int) -> Request:
        """Write `tensor`'s bytes (contiguous, CPU) to `fd` at byte `offset`."""
        self.bytes_written += tensor.numel() * tensor.element_size()
        return self._submit(os.pwritev, fd, tensor, offset)

    def _submit(self, op, fd: int, tensor: torch.Tensor, offset: int) -> Request:
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError("AsyncIO reads and writes contiguous CPU tensors only")
        view = _memoryview(tensor)
        block = self.cfg.block_size
        per_call = block * (1 if self.cfg.single_submit else self.cfg.queue_depth)
        futures = [self._pool.submit(self._call, op, fd, view, offset, start, min(len(view), start + per_call))
                   for start in range(0, len(view), per_call)]
        return Request(futures, len(view))

    def _call(self, op, fd: int, view: memoryview, offset: int, start: int, end: int) -> None:
        """One vectored call over the blocks of view[start:end], repeated from where a short transfer stopped."""
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1
        try:
            self._transfer(op, fd, view, offset, start, end)
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self.busy_s += time.perf_counter() - self._since

    def _transfer(self, op, fd: int, view: memoryview, offset: int, start: int, end: int) -> None:
        block = self.cfg.block_size
        while start < end:
            n = op(fd, [view[b:min(end, b + block)] for b in range(start, end, block)], offset + start)
            if n <= 0:
                raise OSError(f"swap-file I/O moved no bytes at offset {offset + start} (file shorter than expected?)")
            start += n

    def close(self) -> None:
        self._pool.shutdown(wait=True)
