"""Read a ``torch.save`` zip archive as ``torch.load`` will, and refuse one where the two
readers could see different members.

``torch.load`` does not read an archive with :mod:`zipfile` but with its own reader
(``torch._C.PyTorchFileReader``, miniz). Its lookup, read in torch 2.13 and measured
with crafted archives (``tests/unit/test_import_crafted.py``):

- every record lives under one *prefix*: the first central-directory entry's name up
  to its first ``/`` (the file's stem, ``archive`` when saved to a buffer). A member
  outside ``<prefix>/`` (case counts here) makes ``torch.load`` fail;
- a record is looked up as ``<prefix>/<name>`` **ignoring ASCII case**, by a binary
  search over the names sorted that way: ``data.pkl`` finds ``archive/DATA.PKL``,
  and with two case variants either one may be read;
- ``torch.load`` reads ``data.pkl`` (the pickle), ``data/<key>`` for every storage
  the pickle names, ``byteorder``, ``.format_version``, ``.storage_alignment``,
  ``version`` or ``.data/version`` and ``.data/serialization_id``, and takes an
  archive listing ``constants.pkl`` for TorchScript;
- :mod:`zipfile` reads the central directory that ends where the end record starts,
  miniz the one at the offset that record states: two directories, two member lists.

So :func:`read` accepts only what ``torch.save`` writes: one central directory where
the end record says (no comment, no bytes after it), every member under the first
one's prefix with one of the names above spelled as ``torch.save`` spells them, no two
names equal when case is ignored, every member stored uncompressed (``torch.save``
never compresses: a deflated member is a decompression bomb we need not open), and
then asks torch's own reader where each record's bytes lie and how long they are:
anything but the member the scan reads is refused.
"""

from __future__ import annotations

import io
import re
import struct
import zipfile
from dataclasses import dataclass
from typing import Any

import torch

from recovery.errors import FormatError

MAX_PICKLE = 256 << 20
"""Largest ``data.pkl`` scanned; a state dict's pickle is ~100 bytes per tensor."""
MAX_RECORD = 1024
"""Largest small record (``byteorder``, ``version``, ...); ``torch.save`` writes < 64 bytes."""
RECORDS = frozenset(
    {"byteorder", "version", ".data/version", ".format_version", ".storage_alignment"}
    | {".data/serialization_id"}
)
"""The records besides ``data.pkl`` and the storages that ``torch.save`` writes."""
PICKLE = "data.pkl"
STORAGE = re.compile(r"data/([A-Za-z0-9_.-]+)")
"""A storage's record: ``data/<key>``, the key the pickle's persistent id names."""

ADVICE = (
    "if you trust the file, load it where you trust it, save only its tensors "
    "(safetensors.torch.save_file(state_dict, 'model.safetensors')) and import that"
)
_EOCD = struct.Struct("<4s4H2LH")
_LOCATOR = struct.Struct("<4sLQL")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")
_LOCAL = struct.Struct("<4s5H3L2H")


@dataclass(frozen=True)
class Archive:
    """What :func:`read` found: the pickle's bytes and each storage's size."""

    prefix: str
    pickle: bytes
    storages: dict[str, int]
    """Storage key -> its member's size in bytes."""


def said(err: BaseException) -> str:
    """An exception's first line, short: what a one-line refusal quotes of it."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:160]


def _refuse(name: str, expected: str, found: str) -> FormatError:
    return FormatError(
        f"{name}: expected {expected}, found {found}; nothing was unpickled; {ADVICE}"
    )


def _central_directory(data: bytes, *, name: str) -> tuple[int, int]:
    """The one central directory both readers take: ``(offset, entries)``. The end record
    must close the file (no comment), the directory end where the (zip64) end record
    starts, on one disk."""
    eocd = len(data) - _EOCD.size
    if eocd < 0 or data[eocd : eocd + 4] != b"PK\x05\x06" or b"PK\x05\x06" in data[eocd + 1 :]:
        raise FormatError(
            f"{name}: expected a zip archive ending in its end record (torch.save writes no "
            "comment), found none there (truncated or corrupt, or bytes appended); nothing "
            "was unpickled; fetch the file again"
        )
    _, disk, cd_disk, _, entries, size, offset, _ = _EOCD.unpack_from(data, eocd)
    end = eocd
    locator = eocd - _LOCATOR.size
    if locator >= 0 and data[locator : locator + 4] == b"PK\x06\x07":
        _, disk64, record, disks = _LOCATOR.unpack_from(data, locator)
        end = locator - _EOCD64.size
        fields = _EOCD64.unpack_from(data, end) if end >= 0 else (b"",)
        if record != end or fields[0] != b"PK\x06\x06" or disk64 or disks > 1:
            raise _refuse(name, "a zip64 end record before its locator", "none there")
        disk, cd_disk, entries, size, offset = fields[4], fields[5], fields[7], *fields[8:]
    if disk or cd_disk or offset + size != end:
        raise _refuse(
            name,
            f"one central directory ending at byte {end}, where its end record starts",
            f"{size} bytes at byte {offset} on disk {disk} (two directories: two readers "
            "could list different members)",
        )
    return offset, entries


def _members(data: bytes, *, name: str) -> tuple[zipfile.ZipFile, list[zipfile.ZipInfo]]:
    offset, entries = _central_directory(data, name=name)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except Exception as err:  # BadZipFile, struct.error, ...: a corrupt archive either way
        raise FormatError(
            f"{name}: expected a torch.save zip archive, found {said(err)} (truncated or corrupt); "
            "nothing was unpickled; fetch the file again"
        ) from None
    members = archive.infolist()
    if archive.start_dir != offset or len(members) != entries:
        raise _refuse(
            name,
            f"{entries} members in the central directory at byte {offset}",
            f"{len(members)} read at byte {archive.start_dir}",
        )
    return archive, members


def _data_offset(data: bytes, info: zipfile.ZipInfo, *, name: str) -> int:
    """Where a member's bytes start: after its local header, name and extra field."""
    head = info.header_offset
    if head < 0 or head + _LOCAL.size > len(data) or data[head : head + 4] != b"PK\x03\x04":
        raise _refuse(name, f"a local header at byte {head}", "none (corrupt archive)")
    *_, name_size, extra_size = _LOCAL.unpack_from(data, head)
    return head + _LOCAL.size + int(name_size) + int(extra_size)


def _written(record: str) -> bool:
    return record == PICKLE or record in RECORDS or STORAGE.fullmatch(record) is not None


def _record(info: zipfile.ZipInfo, prefix: str, *, name: str) -> str:
    """The record name of a member: its name under ``prefix/``, as torch.save spells it."""
    full = info.filename
    if info.orig_filename != full or not full.startswith(prefix + "/"):
        raise _refuse(
            name,
            f"every member under {prefix}/ (the first member's directory: torch.load "
            "reads only there)",
            f"the member {info.orig_filename!r}",
        )
    record = full[len(prefix) + 1 :]
    if not _written(record):
        # torch's lookup ignores case: say so when that is what the member relies on
        read_as = next((n for n in (PICKLE, *RECORDS) if n == record.lower()), None)
        read_as = read_as or ("data/<key>" if _written(record.lower()) else None)
        found = f"the member {full!r}" + (
            f", which torch's reader reads as {read_as} (it ignores case)" if read_as else ""
        )
        raise _refuse(
            name,
            "only the members torch.save writes, spelled as it spells them (data.pkl, "
            "data/<key>, byteorder, version, ...)",
            found,
        )
    if info.flag_bits & 0x1:
        raise _refuse(name, f"{full} in the clear", "it encrypted")
    if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
        raise _refuse(
            name,
            f"{full} stored uncompressed, as torch.save stores every member",
            f"compression method {info.compress_type} ({info.compress_size} bytes that would "
            f"become {info.file_size}); it was not opened",
        )
    limit = MAX_PICKLE if record == PICKLE else MAX_RECORD if record in RECORDS else None
    if limit is not None and info.file_size > limit:
        raise _refuse(name, f"{full} of at most {limit} bytes", f"{info.file_size} bytes")
    return record


def _torch_agrees(data: bytes, spans: dict[str, tuple[int, int]], *, name: str) -> None:
    """Ask torch's reader (the one ``torch.load`` uses) where each record's bytes lie and
    how many there are; anything but the member this scan checked is refused."""
    try:
        reader: Any = torch._C.PyTorchFileReader(io.BytesIO(data))
        for record, span in spans.items():
            found = (reader.get_record_offset(record), reader.get_record_size(record))
            if found != span:
                raise _refuse(
                    name,
                    f"torch's reader to find {record} at byte {span[0]} "
                    f"({span[1]} bytes), where this scan read it",
                    f"byte {found[0]} ({found[1]} bytes)",
                )
    except FormatError:
        raise
    except Exception as err:  # pybind raises RuntimeError for miniz's refusals; any other too
        raise _refuse(
            name, "an archive torch's reader opens", f"it refused ({said(err)})"
        ) from None


def read(data: bytes, *, name: str) -> Archive:
    """Check the archive ``data`` as above; return its pickle (read once, CRC checked) and
    its storages' sizes. Nothing is unpickled and no storage is read.

    Raises:
        FormatError: naming the member, what was expected and what was found.
    """
    archive, members = _members(data, name=name)
    prefix, slash, _ = members[0].filename.partition("/") if members else ("", "", "")
    if not prefix or not slash:
        first = repr(members[0].filename) if members else "no member"
        raise _refuse(name, "members under one directory (archive/data.pkl)", first)
    spans: dict[str, tuple[int, int]] = {}
    folded: dict[str, str] = {}
    storages: dict[str, int] = {}
    for info in members:
        record = _record(info, prefix, name=name)
        twin = folded.setdefault(record.lower(), record)
        if twin != record or record in spans:  # torch's lookup ignores case: either is read
            raise _refuse(
                name,
                "one member per name, case ignored (torch's reader ignores case)",
                f"{prefix}/{twin} and {prefix}/{record}",
            )
        start = _data_offset(data, info, name=name)
        if start + info.file_size > archive.start_dir:
            raise _refuse(name, f"{info.filename} before the central directory", "it overlaps")
        spans[record] = (start, info.file_size)
        if match := STORAGE.fullmatch(record):
            storages[match.group(1)] = info.file_size
    if PICKLE not in spans:
        raise _refuse(name, f"a torch.save archive holding {prefix}/{PICKLE}", "none")
    _torch_agrees(data, spans, name=name)
    try:
        pickle = archive.read(f"{prefix}/{PICKLE}")
    except Exception as err:  # zipfile: BadZipFile, NotImplementedError (a version), ...
        raise FormatError(
            f"{name}:{prefix}/{PICKLE}: cannot be read ({said(err)}); the archive is corrupt; "
            "fetch it again"
        ) from None
    return Archive(prefix, pickle, storages)
