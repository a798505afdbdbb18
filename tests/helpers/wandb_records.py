"""Reads the records of an offline W&B run file (run-*.wandb) so tests can check what was logged.

The file is a 7-byte W&B header followed by a LevelDB-style log: 32 KiB blocks of chunks, each with
a 7-byte header (crc32c, little-endian length, type FULL=1/FIRST=2/MIDDLE=3/LAST=4) and a piece of
one protobuf `Record`. wandb itself no longer ships a reader, hence this small one (test-only).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
FILE_HEADER = 7
CHUNK_HEADER = 7


def _payloads(data: bytes):
    pos, pending = FILE_HEADER, b""
    while pos + CHUNK_HEADER <= len(data):
        block_left = BLOCK - (pos % BLOCK)
        if block_left < CHUNK_HEADER:  # trailer padding at the end of a block
            pos += block_left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        chunk = data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""
        else:
            break


def read_offline_run_when_written(run_dir: Path, expected_history: int, timeout_s: float = 20.0) -> dict:
    """wandb's finish() returns before its service has written the file; poll until it holds the history."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        run = read_offline_run(run_dir)
        if len(run["history"]) >= expected_history or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


def read_offline_run(run_dir: Path) -> dict:
    """{"history": [{key: value}], "config": {key: value}, "summary": {key: value}, "name": str, "group": str,
    "tags": [...]}."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = list(Path(run_dir).glob("run-*.wandb"))
    out = {"history": [], "config": {}, "summary": {}, "name": None, "group": None, "tags": []}
    for payload in _payloads(path.read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            out["history"].append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            out["summary"].update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                                   for i in record.summary.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "run":
            out["name"], out["group"] = record.run.display_name, record.run.run_group
            out["tags"] = list(record.run.tags)
            out["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
    return out
