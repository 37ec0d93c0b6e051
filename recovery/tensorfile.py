"""Streaming writer for safetensors files: no full copy in memory, hashed while written.

``safetensors.torch.save``/``save_file`` first turn every tensor into a Python
``bytes`` object, so a save needs a second copy of the whole state in fresh
memory (slow to touch on these machines, and it doubles peak memory), and the
file must then be read back to hash it. This writer lays out the same format
(8-byte little-endian header length, JSON header padded with spaces to an
8-byte boundary, then each tensor's raw bytes at its ``data_offsets``) and
streams each tensor's memory straight into the file. Reading stays with the
official ``safetensors`` library, which checks every offset; the tests read
what this writes with it.

Hashing runs in a helper thread, overlapped with the writes (both release the
GIL), so the digest costs no second pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from recovery import faults
from recovery.errors import FormatError
from recovery.manifest import FileRecord

CHUNK = 8 << 20

DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def _raw(t: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy when it is a contiguous CPU tensor."""
    flat = t.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    array: Any = flat.contiguous().view(torch.uint8).numpy()
    return memoryview(array).cast("B")


def header(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """The length prefix and JSON header for ``tensors`` laid out in the given order.

    Raises:
        FormatError: a dtype safetensors cannot store.
    """
    entries: dict[str, object] = {}
    if metadata:
        entries["__metadata__"] = dict(metadata)
    offset = 0
    for key, t in tensors.items():
        if t.dtype not in DTYPES:
            raise FormatError(f"tensor '{key}' has dtype {t.dtype}, which safetensors cannot store")
        size = t.numel() * t.element_size()
        entries[key] = {
            "dtype": DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    body = json.dumps(entries, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(8, "little") + body


def chunks(tensors: Mapping[str, torch.Tensor]) -> Iterator[memoryview]:
    """The file's bytes as a sequence of views: header, then each tensor's memory in slices."""
    yield memoryview(header(tensors))
    for t in tensors.values():
        raw = _raw(t)
        for start in range(0, len(raw), CHUNK):
            yield raw[start : start + CHUNK]


def size_of(tensors: Mapping[str, torch.Tensor]) -> int:
    """Bytes the file will have."""
    return len(header(tensors)) + sum(t.numel() * t.element_size() for t in tensors.values())


def write_stream(
    path: Path, parts: Iterable[memoryview | bytes], *, fault_point: str | None = None
) -> FileRecord:
    """Create ``path`` from ``parts``, hashing in a helper thread while writing; fsync it.

    Args:
        path: the new file (must not exist).
        parts: the file's bytes in order; each part must stay unchanged until written.
        fault_point: a :mod:`recovery.faults` point reached after the first half of the parts.
    """
    h = hashlib.sha256()
    todo: queue.Queue[memoryview | bytes | None] = queue.Queue(maxsize=8)

    def hasher() -> None:
        while (part := todo.get()) is not None:
            h.update(part)

    thread = threading.Thread(target=hasher, name="recovery-hash", daemon=True)
    thread.start()
    written = 0
    items = list(parts)
    try:
        with open(path, "xb") as fh:
            for i, part in enumerate(items):
                todo.put(part)
                fh.write(part)
                written += len(part)
                if fault_point and i == len(items) // 2:
                    fh.flush()
                    faults.reach(fault_point)
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        todo.put(None)
        thread.join()
    return FileRecord(path.name, h.hexdigest(), written)
