"""Reading one rank's region of a tensor from a .safetensors file with plain file reads, not a memory map.

    regions = SafetensorsRegions(path)              # the header only
    part = regions.read("model.layers.0.mlp.up_proj.weight", (slice(0, 512), slice(0, 1536)))

Why not safetensors' own slices: safe_open maps the whole file, and every page a slice touches stays resident in
the process (counted in its RSS) until the file is closed, so a rank that reads its half of every tensor ends up
holding its shards twice over, once as parameters and once as mapped file pages. Here the rows of the region are
read with pread into a fresh buffer (the page cache keeps the file, not the process), and the other dimensions
are cut from those rows. The file layout is the safetensors format's: an 8-byte little-endian header length, the
JSON header (dtype, shape and data_offsets per tensor), then the row-major data.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


class SafetensorsRegions:
    """One .safetensors file: its header, and regions of its tensors read on demand."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        self.data_start = 8 + length
        self.entries = header

    def read(self, name: str, region: tuple[slice, ...]) -> torch.Tensor:
        """The tensor's `region` (one slice per dimension, steps of 1) as a new tensor of the stored dtype."""
        entry = self.entries[name]
        shape, dtype = list(entry["shape"]), DTYPES[entry["dtype"]]
        begin = entry["data_offsets"][0]
        if not shape:
            rows, row_shape = slice(0, 1), []
        else:
            rows, row_shape = region[0], shape[1:]
        row_bytes = math.prod(row_shape) * dtype.itemsize
        count = rows.stop - rows.start
        buffer = bytearray(count * row_bytes)
        if buffer:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                view, offset = memoryview(buffer), self.data_start + begin + rows.start * row_bytes
                while view:  # pread may return fewer bytes than asked
                    got = os.preadv(fd, [view], offset)
                    if got <= 0:
                        raise OSError(f"{self.path}: the data of {name} ends early (truncated file?)")
                    view, offset = view[got:], offset + got
            finally:
                os.close(fd)
        tensor = torch.frombuffer(buffer, dtype=dtype) if buffer else torch.empty(0, dtype=dtype)
        tensor = tensor.reshape(shape) if not shape else tensor.reshape(count, *row_shape)
        rest = tuple(region[1:])
        return tensor[(slice(None), *rest)].clone() if any(
            r != slice(0, size) for r, size in zip(rest, row_shape)) else tensor
