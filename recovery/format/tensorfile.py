"""safetensors files streamed to disk and read back zero-copy, hashed on the way.

``safetensors.torch.save``/``save_file`` first turn every tensor into a Python
``bytes`` object, so a save needs a second copy of the whole state in fresh
memory (slow to touch on these machines, and it doubles peak memory), and the
file must then be read back to hash it. This writer lays out the same format
(8-byte little-endian header length, JSON header padded with spaces to an
8-byte boundary, then each tensor's raw bytes at its ``data_offsets``, larger
element sizes first so every tensor is aligned) and streams each tensor's
memory straight into the file.

Reading is the mirror image: the verifier reads a whole file once into one
buffer (hashing it in a helper thread as it arrives), and :func:`views` turns
that same, verified buffer into tensors without copying, after checking the
header as strictly as the official reader does (known dtypes, shapes that
match their byte ranges, ranges inside the file that tile the data section
exactly). ``safetensors.torch.load`` would copy every tensor into fresh memory
a second time. The tests check both directions against the official library.

Hashing runs in a helper thread, overlapped with the I/O (both release the
GIL), so the digest costs no second pass.

Every file's header carries ``__metadata__`` ``{"format": "pt"}``: Hugging Face's
loaders (``transformers``' ``from_pretrained``) warn about, or refuse, a
safetensors file whose metadata does not name its framework.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from recovery import faults
from recovery.errors import FormatError, TruncatedFileError
from recovery.format import digests, safeheader
from recovery.format.manifest import FileRecord

CHUNK = digests.CHUNK
hash_file = digests.hash_file
hash_fd = digests.hash_fd
workers = digests.workers
"""Re-exported: hashing a file needs no torch (:mod:`recovery.format.digests`)."""

METADATA: dict[str, str] = {"format": "pt"}
"""What every header's ``__metadata__`` holds (the framework, as Hugging Face expects)."""

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

    ``__metadata__`` is :data:`METADATA` updated with ``metadata`` (string values only,
    as the format requires).

    Raises:
        FormatError: a dtype safetensors cannot store.
    """
    entries: dict[str, object] = {"__metadata__": {**METADATA, **(metadata or {})}}
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


def ordered(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors in file order: larger element sizes first (stable), so each stays aligned."""
    return dict(sorted(tensors.items(), key=lambda kv: -kv[1].element_size()))


def chunks(tensors: Mapping[str, torch.Tensor]) -> Iterator[memoryview]:
    """The file's bytes as a sequence of views: header, then each tensor's memory in slices."""
    tensors = ordered(tensors)
    yield memoryview(header(tensors))
    for t in tensors.values():
        raw = _raw(t)
        for start in range(0, len(raw), CHUNK):
            yield raw[start : start + CHUNK]


def size_of(tensors: Mapping[str, torch.Tensor]) -> int:
    """Bytes the file will have."""
    return len(header(ordered(tensors))) + sum(
        t.numel() * t.element_size() for t in tensors.values()
    )


_BY_NAME = {name: dtype for dtype, name in DTYPES.items()}


def views(
    buffer: torch.Tensor, *, name: str, advice: str = safeheader.DEFAULT_ADVICE
) -> dict[str, torch.Tensor]:
    """Tensors over ``buffer`` (a uint8 tensor holding a whole safetensors file), no copy,
    after :func:`recovery.format.safeheader.parse` has checked its header.

    ``advice`` ends the error message (what the reader should do about a bad file).

    Raises:
        FormatError: naming the file, when the bytes are not a well-formed
            safetensors file (a pickle under that name, say).
    """
    total = buffer.numel()
    first = bytes(buffer[:8].numpy())
    end = safeheader.needed(first, total, name=name, advice=advice)
    head = safeheader.parse(bytes(buffer[:end].numpy()), total, name=name, advice=advice)
    out: dict[str, torch.Tensor] = {}
    for e in head.entries:
        dtype = _BY_NAME[e.dtype]
        raw = buffer[head.start + e.begin : head.start + e.end]
        if (head.start + e.begin) % safeheader.ITEMSIZE[e.dtype]:
            raw = raw.clone()  # misaligned (a foreign writer): one small copy
        out[e.key] = raw.view(dtype).reshape(e.shape)
    return dict(sorted(out.items()))


def read_hashed(
    path: Path,
    *,
    size: int,
    algorithm: str = digests.SHA256,
    progress: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, str]:
    """Read a whole file into one new uint8 tensor, hashing it while it arrives.

    Args:
        path: an existing regular file (opened without following symlinks).
        size: the number of bytes expected (already checked against the file's size).
        algorithm: the hash (:data:`recovery.format.digests.ALGORITHMS`).

    Returns:
        ``(buffer, hex digest)``.

    Raises:
        TruncatedFileError: the file holds fewer bytes than ``size`` (it shrank while read).
    """
    h = digests.new(algorithm)
    buffer = torch.empty(size, dtype=torch.uint8)
    array: Any = buffer.numpy()
    mem = memoryview(array).cast("B")
    todo: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()

    def hasher() -> None:
        while (part := todo.get()) is not None:
            h.update(part)

    thread = threading.Thread(target=hasher, name="recovery-hash", daemon=True)
    thread.start()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with open(fd, "rb", buffering=0) as fh:
            got = 0
            while got < size:
                n = fh.readinto(mem[got : min(size, got + CHUNK)])
                if not n:
                    break
                todo.put(mem[got : got + n])
                got += n
                if progress is not None:
                    progress(n)
    finally:
        todo.put(None)
        thread.join()
    if got != size:
        raise TruncatedFileError(
            f"{path}: expected {size} bytes, read {got}; the file shrank while it was read. "
            "Resume from another checkpoint.",
            path=path,
        )
    return buffer, h.hexdigest()


def write_stream(
    path: Path,
    parts: Iterable[memoryview | bytes],
    *,
    fault_point: str | None = None,
    progress: Callable[[int], None] | None = None,
    algorithm: str = digests.SHA256,
) -> FileRecord:
    """Create ``path`` from ``parts``, hashing in a helper thread while writing; fsync it.

    Args:
        path: the new file (must not exist).
        parts: the file's bytes in order; each part must stay unchanged until written.
        fault_point: a :mod:`recovery.faults` point reached after the first half of the parts.
        progress: called with the number of bytes after each part.
        algorithm: the hash (:data:`recovery.format.digests.ALGORITHMS`).
    """
    h = digests.new(algorithm)
    # Unbounded: the parts are views of memory that exists anyway, so queueing costs
    # nothing, and the writer never waits for the hasher (measured: a bounded queue
    # serialised the two and cost a third more time per GiB).
    todo: queue.SimpleQueue[memoryview | bytes | None] = queue.SimpleQueue()

    def hasher() -> None:
        while (part := todo.get()) is not None:
            h.update(part)

    thread = threading.Thread(target=hasher, name="recovery-hash", daemon=True)
    thread.start()
    written = 0
    items = list(parts)
    try:
        # unbuffered: large parts go straight to write(2), no copy into a Python buffer
        with open(path, "xb", buffering=0) as fh:
            for i, part in enumerate(items):
                todo.put(part)
                view = memoryview(part)
                while view:
                    n = fh.write(view)
                    view = view[n:]
                written += len(part)
                if progress is not None:
                    progress(len(part))
                if fault_point and i == len(items) // 2:
                    faults.reach(fault_point)
            # data plus the size needed to read it back; mtime and the like are not needed
            os.fdatasync(fh.fileno())
    finally:
        todo.put(None)
        thread.join()
    return FileRecord(path.name, h.hexdigest(), written)
