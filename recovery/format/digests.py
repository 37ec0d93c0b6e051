"""The hash functions a manifest may name, and a fresh hasher for each.

``sha256`` is the default: the ``model_signing verify key`` CLI (1.1.1)
verifies sha256 over whole files and nothing else. ``blake3`` (about four
times faster on one core here) is accepted by model-signing's Python API
(``model_signing.verifying``, which reads the method from the manifest) and by
our own reader; it needs the ``blake3`` package (``recovery[blake3]``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from recovery.errors import FormatError

SHA256 = "sha256"
BLAKE3 = "blake3"
ALGORITHMS = (SHA256, BLAKE3)

CHUNK = 8 << 20
"""Bytes read (or written) at a time."""


class Hasher(Protocol):
    """What a running digest offers (hashlib's and blake3's objects alike)."""

    def update(self, data: bytes | memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def new(algorithm: str) -> Hasher:
    """A fresh hasher for ``algorithm`` (one of :data:`ALGORITHMS`).

    Raises:
        FormatError: an unknown algorithm, or blake3 without its package.
    """
    if algorithm == SHA256:
        return hashlib.sha256()
    if algorithm == BLAKE3:
        try:
            from blake3 import blake3
        except ImportError:
            raise FormatError(
                "hash blake3: the blake3 package is not installed; install it with "
                "pip install -e '.[blake3]' (or save with checkpoint.hash=sha256)"
            ) from None
        return blake3()
    raise FormatError(f"hash {algorithm!r}: expected one of {', '.join(ALGORITHMS)}")


def of(data: bytes | memoryview, algorithm: str) -> str:
    """The hex digest of ``data``."""
    h = new(algorithm)
    h.update(data)
    return h.hexdigest()


def hash_file(
    path: Path,
    *,
    algorithm: str = SHA256,
    progress: Callable[[int], None] | None = None,
) -> tuple[str, int]:
    """The digest and size of a file already on disk (a symlink is refused, not followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return hash_fd(fd, algorithm=algorithm, progress=progress)
    finally:
        os.close(fd)


def hash_fd(
    fd: int,
    *,
    algorithm: str = SHA256,
    progress: Callable[[int], None] | None = None,
) -> tuple[str, int]:
    """The digest and size of the file open on ``fd``, read from its start with positioned
    reads (the descriptor's offset is neither used nor moved) into one reused buffer."""
    digest = new(algorithm)
    buffer = memoryview(bytearray(CHUNK))
    size = 0
    while got := os.preadv(fd, [buffer], size):
        digest.update(buffer[:got])
        size += got
        if progress is not None:
            progress(got)
    return digest.hexdigest(), size


def workers(count: int) -> int:
    """Threads to read or write ``count`` files at once: one per core, at most ``count``."""
    return max(1, min(count, os.cpu_count() or 1))
