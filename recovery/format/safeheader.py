"""A safetensors file's header, checked without torch, and read in the same pass that hashes it.

The format: an 8-byte little-endian header length ``n``, ``n`` bytes of JSON
(``{tensor: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}``),
then the data section. :func:`parse` refuses every header the official
reader (safetensors 0.8) refuses, and more: UTF-8 JSON with no key twice in
an object; each tensor exactly ``dtype`` (a known name), ``shape`` (integers
>= 0) and ``data_offsets`` (two integers, begin <= end), typed as the official
reader's ``u64`` (no ``"2"``, ``2.0`` or ``true``); shapes that match their
byte ranges, ranges that tile the data section exactly, ending at the file's
end; ``__metadata__`` strings by name. It is the one check both the decoder
(:func:`recovery.format.tensorfile.views`, which then views the bytes as
tensors) and the hash-only verifier (:func:`read_hashed`, which never decodes
tensors) run.
"""

from __future__ import annotations

import json
import os
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery.errors import FormatError, TruncatedFileError
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

FIELDS = frozenset({"dtype", "shape", "data_offsets"})
"""A tensor entry's fields, all required and no other."""

U64_MAX = (1 << 64) - 1
"""The largest shape, offset, element count and bit size the official reader takes."""


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

    Refused, beyond what the official reader refuses: a key repeated in any JSON object
    (it keeps the last), a tensor entry with a field other than ``dtype``, ``shape`` and
    ``data_offsets``, and a ``__metadata__`` of ``null``.

    Raises:
        FormatError: naming ``name``, when the bytes are not a well-formed safetensors
            header (a pickle under that name, say); ``advice`` ends the message.
    """
    start = needed(prefix, total, name=name, advice=advice)
    if len(prefix) < start:
        raise _bad(name, advice, f"a header cut short at {len(prefix)} of {start} bytes")
    try:
        head = _load(bytes(prefix[8:start]))
    except ValueError as err:  # UnicodeError and JSONDecodeError among them
        raise _bad(name, advice, f"an unreadable header ({err})") from None
    if not isinstance(head, dict):
        raise _bad(name, advice, "a header that is not a JSON object")
    entries = []
    for key, spec in head.items():
        if key == "__metadata__":
            if not isinstance(spec, dict) or not all(isinstance(v, str) for v in spec.values()):
                raise _bad(name, advice, f"__metadata__ {_show(spec)}, not strings by name")
            continue
        entries.append(_entry(key, spec, name=name, advice=advice))
    entries.sort(key=lambda e: (e.begin, e.end, e.key))
    cursor = 0
    for e in entries:
        if e.begin != cursor:
            raise _bad(
                name,
                advice,
                f"{e.key!r} starting at {e.begin}, expected {cursor} (a gap or an overlap)",
            )
        cursor = e.end
    if start + cursor != total:
        raise _bad(name, advice, f"data ending at {start + cursor}, file size {total}")
    return Header(start, entries)


def _load(text: bytes) -> Any:
    """The header's JSON: UTF-8 only (``json.loads`` of bytes would also take UTF-16 and
    UTF-32), no key twice in one object, no lone surrogate, within the nesting limit.

    Raises:
        ValueError: naming what is wrong.
    """

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise ValueError(f"the key {k!r} twice in one object")
            k.encode()  # a lone surrogate ("\\ud800") is no UTF-8: the official reader refuses it
            if isinstance(v, str):
                v.encode()
            out[k] = v
        return out

    try:
        # "-0" is the float -0.0 to the official reader (no u64), so it is here
        obj = json.loads(text.decode("utf-8"), object_pairs_hook=unique, parse_int=_int)
    except RecursionError:
        raise ValueError(f"nested more than {bounded.MAX_DEPTH} levels deep") from None
    bounded.check_depth(obj)
    return obj


def _int(digits: str) -> int | float:
    return -0.0 if digits == "-0" else int(digits)


def _entry(key: str, spec: Any, *, name: str, advice: str) -> Entry:
    """One tensor's entry, typed as the official reader's (``u64`` integers, no coercion).

    Raises:
        FormatError: naming ``name``, ``key``, what was expected and what was found.
    """
    if not isinstance(spec, dict) or spec.keys() != FIELDS:
        found = _show(sorted(spec) if isinstance(spec, dict) else spec)
        raise _bad(name, advice, f"{key!r} described by {found}, not exactly {sorted(FIELDS)}")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise _bad(
            name, advice, f"{key!r} of dtype {_show(dtype)}, not one of {', '.join(ITEMSIZE)}"
        )
    if not isinstance(shape, list) or not all(_u64(d) for d in shape):
        raise _bad(name, advice, f"{key!r} of shape {_show(shape)}, not a list of integers >= 0")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_u64, offsets))):
        raise _bad(name, advice, f"{key!r} at data_offsets {_show(offsets)}, not two integers >= 0")
    count = 1
    for d in shape:  # in order, as the official reader multiplies (and overflows)
        count *= d
        if count > U64_MAX:
            raise _bad(name, advice, f"{key!r} of shape {shape}, more than 2**64 elements")
    size = count * ITEMSIZE[dtype]
    begin, end = offsets
    if size * 8 > U64_MAX or begin > end or end - begin != size:
        raise _bad(
            name, advice, f"{key!r} spanning {begin}..{end} for {size} bytes of {shape} {dtype}"
        )
    return Entry(key, dtype, tuple(shape), begin, end)


def _u64(x: Any) -> bool:
    """An integer the official reader's ``u64`` takes (a bool is no integer here)."""
    return type(x) is int and 0 <= x <= U64_MAX


def _show(value: Any) -> str:
    """A found value, cut short (a header may hold 100 MB of it)."""
    return reprlib.repr(value)


Spans = Callable[[bytes], list[tuple[int, int]]]
"""Given a file's header bytes, the byte ranges ``[begin, end)`` of the file to keep too."""


def read_hashed(
    path: Path,
    *,
    size: int,
    algorithm: str = digests.SHA256,
    progress: Callable[[int], None] | None = None,
    also: Spans | None = None,
) -> tuple[str, bytes, dict[tuple[int, int], bytes]]:
    """Hash the ``size``-byte file ``path`` (no symlink followed) in one pass, keeping its
    header's bytes and the ranges ``also`` names once it has the header: ``(hex digest,
    the file's first bytes up to its header's end, the bytes of each range)``.

    The prefix is what :func:`parse` checks once the digest matches, and the ranges are
    the very bytes hashed (a delta's row indexes, say); nothing else of the file stays in
    memory. A length that cannot be a header keeps the first 8 bytes only (:func:`parse`
    then names it).

    Raises:
        TruncatedFileError: the file holds fewer bytes than ``size`` (it shrank while read).
    """
    h = digests.new(algorithm)
    buffer = memoryview(bytearray(digests.CHUNK))
    kept = bytearray()  # the file's bytes [0, keep): all read so far while got < keep
    keep, decided, got = 8, False, 0
    ranges: dict[tuple[int, int], bytearray] | None = None if also is not None else {}
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
            if ranges is None and also is not None and decided and got + n >= keep:
                ranges = {span: bytearray() for span in also(bytes(kept))}
            for (begin, end), into in (ranges or {}).items():  # in file order, chunk by chunk
                lo, hi = max(begin, got), min(end, got + n)
                if lo < hi:
                    into += buffer[lo - got : hi - got]
            got += n
            if progress is not None:
                progress(n)
    finally:
        os.close(fd)
    if got != size:
        raise TruncatedFileError(
            f"{path}: expected {size} bytes, read {got}; the file shrank while it was read. "
            "Resume from another checkpoint.",
            path=path,
        )
    return h.hexdigest(), bytes(kept), {span: bytes(b) for span, b in (ranges or {}).items()}
