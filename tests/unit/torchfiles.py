"""Crafted ``torch.save`` files, as an attacker would hand them over: real archives and
pickles built with :mod:`zipfile` and :mod:`pickle`, which ``torch.load`` reads (nothing
here imitates torch; every test that uses one runs the real scan, and torch's own reader
where it shows what torch would do)."""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile
from pathlib import Path

import torch


class Payload:
    """Unpickling this runs a shell command (harmless: it appends to ``target``)."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"echo pwned >> {self.target}",))


class Storage:
    """A storage as a persistent id states it: key, element count, storage class."""

    def __init__(self, key: str, numel: int, kind=torch.FloatStorage) -> None:
        self.key, self.numel, self.kind = key, numel, kind


class View:
    """A tensor as ``_rebuild_tensor_v2`` rebuilds it: any offset, size and stride."""

    def __init__(self, storage: Storage, offset: int, size, stride) -> None:
        self.args = (storage, offset, torch.Size(size), tuple(stride))

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, (*self.args, False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.kind, obj.key, "cpu", obj.numel)
        return None


def dumps(obj) -> bytes:
    """``obj`` pickled as torch.save pickles (protocol 2, storages as persistent ids)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def saved(obj, *, legacy: bool = False) -> bytes:
    """What ``torch.save(obj)`` writes."""
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=not legacy)
    return buf.getvalue()


def members(data: bytes) -> list[tuple[str, bytes]]:
    """An archive's members, in order."""
    archive = zipfile.ZipFile(io.BytesIO(data))
    return [(info.filename, archive.read(info)) for info in archive.infolist()]


def zipped(entries: list[tuple[str, bytes]], *, deflate: tuple[str, ...] = ()) -> bytes:
    """A zip archive of ``entries`` in order, stored (the names in ``deflate`` deflated)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as out:
        for name, blob in entries:
            kind = zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED
            out.writestr(zipfile.ZipInfo(name), blob, compress_type=kind)
    return buf.getvalue()


def archive(obj, storages: dict[str, bytes]) -> bytes:
    """A torch.save-shaped archive: ``obj``'s pickle and the storages' bytes."""
    entries = [("archive/data.pkl", dumps(obj)), ("archive/byteorder", b"little")]
    entries += [(f"archive/data/{key}", blob) for key, blob in storages.items()]
    return zipped([*entries, ("archive/version", b"3\n")])


def bomb(path: Path, *, numel: int) -> None:
    """An archive whose storage ``0`` states ``numel`` float32 and holds them as zeros
    deflated (a few hundred KiB for 256 MiB): what inflates when torch reads it."""
    obj = {"w": View(Storage("0", numel), 0, (numel,), (1,))}
    with zipfile.ZipFile(path, "w") as out:
        out.writestr("archive/data.pkl", dumps(obj))
        out.writestr("archive/byteorder", b"little")
        info = zipfile.ZipInfo("archive/data/0")
        info.compress_type = zipfile.ZIP_DEFLATED
        with out.open(info, "w", force_zip64=True) as fh:
            chunk = bytes(1 << 20)
            for _ in range(numel * 4 >> 20):
                fh.write(chunk)
        out.writestr("archive/version", b"3\n")


def two_directories(payload: bytes) -> bytes:
    """A torch.save archive with two central directories: :mod:`zipfile` (which reads the
    one that ends at the end record) lists the harmless ``archive/data.pkl``; torch's
    reader (which reads the one at the offset the end record states) lists ``payload``
    under that same name."""
    hidden_name = b"archive/zzzz.pkl"  # as long as archive/data.pkl: equal directories
    padded = payload + bytes(2048)  # unpickling stops at STOP; the padding is ignored
    data = zipped([(hidden_name.decode(), padded), *members(saved({"w": torch.ones(2)}))])
    start = zipfile.ZipFile(io.BytesIO(data)).start_dir
    end = data.index(b"PK\x05\x06", start)
    entries, pos = [], start
    while pos < end:
        n, e, c = struct.unpack_from("<3H", data, pos + 28)
        entries.append(data[pos : pos + 46 + n + e + c])
        pos += 46 + n + e + c
    hidden, listed = entries[0], entries[1:]
    size = sum(map(len, listed))
    # zipfile adds the gap between the stated and its directory to every offset: undo it
    shifted = [
        e[:42] + struct.pack("<L", struct.unpack_from("<L", e, 42)[0] - size) + e[46:]
        for e in listed
    ]
    torch_sees = [hidden.replace(hidden_name, b"archive/data.pkl")]
    torch_sees += [e for e in listed if b"archive/data.pkl" not in e]
    count = len(listed)
    tail = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, size, start, 0)
    return data[:start] + b"".join(torch_sees) + b"".join(shifted) + tail
