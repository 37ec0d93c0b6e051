"""A safetensors file's header, checked without torch, and read in the same pass that hashes it.

The format: an 8-byte little-endian header length ``n``, ``n`` bytes of JSON
(``{tensor: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}``),
then the data section. :func:`parse` checks a header as strictly as the
official reader does (known dtypes, shapes that match their byte ranges,
ranges that tile the data section exactly, ending at the file's end); it is
the one check both the decoder (:func:`recovery.format.tensorfile.views`,
which then views the bytes as tensors) and the hash-only verifier
(:func:`read_hashed`, which never decodes tensors) run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recovery.errors import FormatError
from recovery.format import bounded, digests

ITEMSIZE: dict[str, int] = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
"""Each dtype name the format allows -> bytes per element."""

MAX_HEADER = 100 << 20
"""The largest header accepted (the official reader's limit)."""

DEFAULT_ADVICE = "the file was not written by this tool"


@dataclass(frozen=True)
class Entry:
    """One tensor of the header: its bytes are ``data[begin:end]``."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A checked header: where the data section starts, and its tensors by offset."""

    start: int
    entries: list[Entry]

    def keys(self) -> set[str]:
        """The tensors' names."""
        return {e.key for e in self.entries}


def _bad(name: str, advice: str, what: str) -> FormatError:
    return FormatError(f"{name}: expected a safetensors file, found {what}; {advice}")


def needed(first: bytes, total: int, *, name: str, advice: str = DEFAULT_ADVICE) -> int:
    """Bytes from the file's start that hold its header (8 + its length), from its
    first 8 bytes and its size ``total``.

    Raises:
        FormatError: naming ``name``, a file too short or a length past the file or the limit.
    """
    if total < 8 or len(first) < 8:
        raise _bad(name, advice, f"{total} bytes")
    n = int.from_bytes(first[:8], "little")
    if n > total - 8 or n > MAX_HEADER:
        raise _bad(name, advice, f"a header length of {n} bytes in a {total}-byte file")
    return 8 + n


def parse(prefix: bytes, total: int, *, name: str, advice: str = DEFAULT_ADVICE) -> Header:
    """Check the header at the start of ``prefix`` (the file's first bytes, at least
    :func:`needed` of them) of a ``total``-byte file.

    Raises:
        FormatError: naming ``name``, when the bytes are not a well-formed safetensors
            header (a pickle under that name, say); ``advice`` ends the message.
    """
    start = needed(prefix, total, name=name, advice=advice)
    if len(prefix) < start:
        raise _bad(name, advice, f"a header cut short at {len(prefix)} of {start} bytes")
    try:
        head = bounded.json_loads(bytes(prefix[8:start]))
    except (UnicodeDecodeError, ValueError) as err:
        raise _bad(name, advice, f"an unreadable header ({err})") from None
    if not isinstance(head, dict):
        raise _bad(name, advice, "a header that is not a JSON object")
    entries = []
    for key, spec in head.items():
        if key == "__metadata__":
            continue
        try:
            itemsize = ITEMSIZE[spec["dtype"]]
            shape = tuple(int(d) for d in spec["shape"])
            begin, end = (int(x) for x in spec["data_offsets"])
        except (KeyError, TypeError, ValueError) as err:
            raise _bad(name, advice, f"a malformed entry for '{key}' ({err!r})") from None
        count = 1
        for d in shape:
            if d < 0:
                raise _bad(name, advice, f"a negative dimension for '{key}'")
            count *= d
        size = count * itemsize
        if begin < 0 or end - begin != size:
            raise _bad(
                name,
                advice,
                f"'{key}' spanning {begin}..{end} for {size} bytes of {list(shape)} "
                f"{spec['dtype']}",
            )
        entries.append(Entry(key, spec["dtype"], shape, begin, end))
    entries.sort(key=lambda e: (e.begin, e.end, e.key))
    cursor = 0
    for e in entries:
        if e.begin != cursor:
            raise _bad(
                name,
                advice,
                f"'{e.key}' starting at {e.begin}, expected {cursor} (a gap or an overlap)",
            )
        cursor = e.end
    if start + cursor != total:
        raise _bad(name, advice, f"data ending at {start + cursor}, file size {total}")
    return Header(start, entries)


def read_hashed(
    path: Path,
    *,
    size: int,
    algorithm: str = digests.SHA256,
    progress: Callable[[int], None] | None = None,
) -> tuple[str, bytes]:
    """Hash the ``size``-byte file ``path`` (no symlink followed) in one pass, keeping only
    its header's bytes: ``(hex digest, the file's first bytes up to its header's end)``.

    The prefix is what :func:`parse` checks once the digest matches; nothing else of the
    file stays in memory. A length that cannot be a header keeps the first 8 bytes only
    (:func:`parse` then names it).

    Raises:
        FormatError: the file holds fewer bytes than ``size`` (it changed while read).
    """
    h = digests.new(algorithm)
    buffer = memoryview(bytearray(digests.CHUNK))
    kept = bytearray()  # the file's bytes [0, keep): all read so far while got < keep
    keep, decided, got = 8, False, 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        while got < size and (n := os.preadv(fd, [buffer[: min(size - got, len(buffer))]], got)):
            h.update(buffer[:n])
            if not decided and got + n >= 8:  # the length is known: keep up to the header's end
                length = int.from_bytes(bytes(kept) + bytes(buffer[: 8 - got]), "little")
                keep = 8 + length if length <= min(MAX_HEADER, size - 8) else 8
                decided = True
            if got < keep:
                kept += buffer[: min(n, keep - got)]
            got += n
            if progress is not None:
                progress(n)
    finally:
        os.close(fd)
    if got != size:
        raise FormatError(f"{path}: expected {size} bytes, read {got}; the file changed while read")
    return h.hexdigest(), bytes(kept)
