"""The hash functions a manifest may name, and a fresh hasher for each.

``sha256`` is the default: the ``model_signing verify key`` CLI (1.1.1)
verifies sha256 over whole files and nothing else. ``blake3`` (about four
times faster on one core here) is accepted by model-signing's Python API
(``model_signing.verifying``, which reads the method from the manifest) and by
our own reader; it needs the ``blake3`` package (``recovery[blake3]``).
"""

from __future__ import annotations

import hashlib
from typing import Protocol

from recovery.errors import FormatError

SHA256 = "sha256"
BLAKE3 = "blake3"
ALGORITHMS = (SHA256, BLAKE3)


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
                "pip install 'recovery[blake3]' (or save with checkpoint.hash=sha256)"
            ) from None
        return blake3()
    raise FormatError(f"hash {algorithm!r}: expected one of {', '.join(ALGORITHMS)}")


def of(data: bytes | memoryview, algorithm: str) -> str:
    """The hex digest of ``data``."""
    h = new(algorithm)
    h.update(data)
    return h.hexdigest()
