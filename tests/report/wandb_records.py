"""Reading an offline wandb run back: the records of its `.wandb` file, decoded with wandb's own protobuf schema.

wandb 0.31 ships no Python reader for offline runs (its public API needs a server), so the test reads the file: a
7-byte header (b":W&B", 0xBEE1 little-endian, version 0) and then LevelDB's log framing, 32 KiB blocks of chunks
with a 7-byte header each (CRC-32 (4), length (2, little-endian), type (1): 1 full, 2 first, 3 middle, 4 last), a
block's tail shorter than a header being padding. Each reassembled payload is one `wandb_internal_pb2.Record`.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1, f"{path}: not a .wandb file"
    out, pos, parts = [], HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # padding at a block's end
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:  # zero fill (a preallocated block's unused rest)
            pos += left
            continue
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(parts)
            out.append(rec)
            parts = b""
    return out


def history(path: Path) -> dict[int, dict[str, Any]]:
    """step -> {metric: value} of every `run.log` the file holds."""
    steps: dict[int, dict[str, Any]] = {}
    for rec in records(path):
        if rec.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in rec.history.item:
            key = item.key or "/".join(item.nested_key)
            row[key] = json.loads(item.value_json)
        step = int(row.get("_step", rec.history.step.num))
        steps.setdefault(step, {}).update(row)
    return steps


def run_info(path: Path) -> Any:
    """The run record (project, display name, tags) the file starts with."""
    for rec in records(path):
        if rec.WhichOneof("record_type") == "run":
            return rec.run
    raise AssertionError(f"{path}: no run record")
