"""NVMeOffload: what the FSDP2 strategy holds for zero.offload_optimizer / offload_param = nvme.

Built by FSDP2Strategy after fully_shard (the parameter swapper wraps the FSDP2 units) and given the
optimizer by adopt_optimizer (wrapped in NVMeOptimizer, which also swaps the parameter shards in and
out for their update when they live on NVMe). `in_memory()` is the strategy's checkpoint context:
every shard and optimizer state in host memory, as with CPU offload, so checkpoints are ordinary
DCP / full-state checkpoints that do not depend on the swap files. The swap files are scratch
(swap_file.py): unlinked as soon as they are created, so they disappear when the process ends.
"""

from __future__ import annotations

import atexit
import contextlib
import os

import torch
from torch import nn

from dsrecipes.distributed.offload.aio import AsyncIO
from dsrecipes.distributed.offload.optimizer_swapper import NVMeOptimizer
from dsrecipes.distributed.offload.param_swapper import ParameterSwapper
from dsrecipes.distributed.offload.swap_file import remove_empty_directories, swap_directory


class NVMeOffload:
    def __init__(self, zero, rank: int, pin_memory: bool):
        self.zero = zero
        self.pin_memory = pin_memory
        self.directory = swap_directory(str(zero.nvme_path), rank)
        self.aio = AsyncIO(zero.aio)
        self.params: ParameterSwapper | None = None
        self.optimizer: NVMeOptimizer | None = None
        self._depth = 0
        self._writes = False
        self._closed = False
        atexit.register(self.close)

    def attach_model(self, model: nn.Module) -> None:
        """After fully_shard: swap the parameter shards too (zero.offload_param=nvme)."""
        if self.zero.offload_param == "nvme":
            self.params = ParameterSwapper(model, self.aio, self.directory, self.zero.param_buffer_count,
                                           self.zero.buffer_size, self.pin_memory)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> NVMeOptimizer:
        self.optimizer = NVMeOptimizer(optimizer, self.aio, self.directory, self.zero.buffer_count,
                                       self.zero.buffer_size, self.pin_memory, param_swapper=self.params,
                                       swap_states=self.zero.offload_optimizer == "nvme")
        return self.optimizer

    @contextlib.contextmanager
    def in_memory(self, writes: bool):
        """Every parameter shard and optimizer state in memory for the duration (re-entrant); `writes`: the
        body changes them (a checkpoint load), so they are written back to the swap files afterwards."""
        self._depth += 1
        self._writes = self._writes or writes
        outermost = self._depth == 1
        stack = contextlib.ExitStack()
        try:
            if outermost:
                if self.params is not None:
                    stack.enter_context(self.params.resident(dirty=lambda: self._writes))
                if self.optimizer is not None:
                    stack.enter_context(self.optimizer.resident(lambda: self._writes))
            yield
        finally:
            self._depth -= 1
            if outermost:
                stack.close()
                self._writes = False

    def stats(self) -> dict[str, int]:
        """Bytes moved and held so far (the benchmark's and the tests' figures)."""
        out = {"bytes_read": self.aio.bytes_read, "bytes_written": self.aio.bytes_written}
        if self.optimizer is not None:
            out.update(optimizer_file=self.optimizer.file_bytes(), optimizer_pool=self.optimizer.pool_bytes())
        if self.params is not None:
            out.update(param_file=self.params.file.nbytes, param_pool=self.params.pool_bytes(),
                       params_resident=self.params.resident_bytes())
        return out

    def metrics(self) -> dict[str, float]:
        """The run summary's nvme/* figures: GiB moved, the I/O engine's busy time and its bandwidth."""
        gib = 2 ** 30
        stats = self.stats()
        moved = stats["bytes_read"] + stats["bytes_written"]
        busy = self.aio.busy_s
        out = {"nvme/read_gib": stats["bytes_read"] / gib, "nvme/written_gib": stats["bytes_written"] / gib,
               "nvme/io_busy_s": busy, "nvme/io_gib_per_s": moved / gib / busy if busy > 0 else 0.0}
        for key in ("optimizer_file", "param_file", "optimizer_pool", "param_pool"):
            if key in stats:
                out[f"nvme/{key}_mib"] = stats[key] / 2 ** 20
        return out

    def describe(self) -> str:
        where = [kind for kind, key in (("optimizer states", "offload_optimizer"), ("parameter shards", "offload_param"))
                 if getattr(self.zero, key) == "nvme"]
        return f"NVMe offload of {' and '.join(where)} under {self.zero.nvme_path}"

    def close(self) -> None:
        """Wait for I/O in flight and close the swap files (the kernel frees them); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.optimizer is not None:
            self.optimizer.close()
        if self.params is not None:
            self.params.close()
        self.aio.close()
        remove_empty_directories(self.directory, os.path.abspath(str(self.zero.nvme_path)))
