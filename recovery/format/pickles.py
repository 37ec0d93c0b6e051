"""Refuse a ``torch.save`` file whose pickle could run code or allocate past the file,
before torch unpickles anything.

A pickle is a program: ``GLOBAL``/``STACK_GLOBAL``/``INST`` name any importable
callable and ``REDUCE`` calls it, so loading a stranger's ``.pt``, ``.ckpt`` or
``pytorch_model.bin`` can run ``os.system``. :func:`scan` reads the opcodes with
:func:`pickletools.genops`, which executes nothing, and refuses any global
outside :data:`ALLOWED`: what a plain state dict needs (tensors rebuilt from
their storages, ``OrderedDict``, ``torch.Size``, dtypes, devices, sets and
bytes). Then it reads the tensors the pickle would rebuild with inert stand-ins
(:mod:`recovery.format.rebuilds`) and refuses storages the file does not hold and
views past, across or aliasing them. Only then may the caller load the same bytes
with ``torch.load(weights_only=True)``, whose own allowlist is a second,
independent check. The scan covers every pickle ``torch.load`` reads:

- a zip archive (torch >= 1.6): ``<prefix>/data.pkl``, found by torch's own lookup
  (:mod:`recovery.format.zipread`: the first member's directory, case ignored);
  an archive where that lookup could find another member than the one scanned
  (case variants, other members, a second central directory, compressed
  members) is refused;
- the legacy format: the five pickles at the start of the file (magic number,
  protocol, system info, the object, the storage keys), then each storage's
  element count and bytes, to the end of the file.

Anything else (a plain pickle, a tar, a truncated file) is refused: ``torch.load``
would either fail on it or, for a plain pickle, be reading something no
``torch.save`` wrote. Every refusal is a :class:`~recovery.errors.FormatError`
naming the file, what was expected, what was found and what to do.
"""

from __future__ import annotations

import io
import pickletools
from typing import Any

import torch

from recovery.errors import FormatError
from recovery.format import rebuilds, zipread
from recovery.format.rebuilds import global_name
from recovery.format.tensorfile import DTYPES
from recovery.format.zipread import ADVICE, MAX_PICKLE

MAX_OPS = 5_000_000
"""Most opcodes in one pickle (~30 per tensor: 150,000 tensors). Each may grow the loader's
stack, so the bound, with :data:`MAX_MEMO`, keeps the scan's and ``torch.load``'s memory
near the pickle's size."""
MAX_MEMO = 1_000_000
"""Most memoized values in one pickle (a few per tensor)."""

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
"""``torch.serialization.MAGIC_NUMBER``: the first pickle of a legacy ``torch.save`` file."""
LEGACY_PICKLES = 5

ALLOWED: frozenset[str] = frozenset(
    {
        "collections.OrderedDict",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_tensor_v3",
        "torch._utils._rebuild_parameter",
        "torch.Size",
        "torch.device",
        "builtins.set",
        "builtins.frozenset",
        "_codecs.encode",  # how protocol 2 spells a bytes object
        *rebuilds.STORAGE_DTYPES,  # torch.FloatStorage, ..., torch.storage.UntypedStorage
        *(str(dtype) for dtype in DTYPES),  # torch.float32, ...: the dtypes we can store
    }
)
"""Every global a plain state dict's pickle needs, as ``module.name``."""

_STRINGS = frozenset(
    [
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "BINUNICODE8",
        "UNICODE",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
    ]
)
_PUTS = ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE")
_GETS = ("GET", "BINGET", "LONG_BINGET")
_INTS = ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4")
_UNKNOWN = object()


def _one(data: bytes | io.BytesIO, *, name: str) -> list[Any]:
    """Scan one pickle (up to its ``STOP``); return the ints it pushes (the legacy magic).

    A ``STACK_GLOBAL`` is accepted only when the two values it pops are strings the scan
    can see (pushed just before, or fetched from a memo slot known to hold one); memo
    slots are tracked exactly (``MEMOIZE`` stores at the memo's current size).

    Raises:
        FormatError: a global outside :data:`ALLOWED`, an extension-registry reference,
            or bytes that are not a whole pickle.
    """
    memo: dict[int, str] = {}  # the slots known to hold a string (others hold _UNKNOWN)
    slots = ops = 0  # memo slots filled, opcodes read: both bounded (the loader's memo and
    # stack grow with them, and so would this scan's own memory)
    recent: list[Any] = []  # values pushed by the latest run of push ops (the last two)
    ints: list[Any] = []  # the first two integers (the legacy format's magic number)
    texts: list[str] = []  # the latest strings seen: where in the data a refusal is
    start: int | None = None

    def refuse(found: str, pos: int, *, names: int = 0) -> FormatError:
        before = texts[: len(texts) - names][-1:]
        near = f" (after the string {before[0]!r})" if before else ""
        return FormatError(
            f"{name}: expected a plain state dict's pickle (tensors, OrderedDict, torch.Size, "
            f"dtypes), found {found} at byte {pos}{near}; nothing was unpickled; {ADVICE}"
        )

    try:
        for op, arg, pos in pickletools.genops(data):
            pos = pos or 0
            start = pos if start is None else start
            ops += 1
            if ops > MAX_OPS or pos - start > MAX_PICKLE:
                raise refuse(
                    f"more than {MAX_OPS} opcodes or {MAX_PICKLE >> 20} MiB of pickle (a "
                    "state dict's pickle is ~30 opcodes and ~100 bytes a tensor)",
                    pos,
                )
            if op.name in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                target = global_name(module, attr)
                if target not in ALLOWED:
                    raise refuse(f"a reference to {target}", pos)
                recent = [_UNKNOWN]
            elif op.name == "STACK_GLOBAL":
                pair = recent[-2:]
                if len(pair) < 2 or not all(isinstance(v, str) for v in pair):
                    raise refuse("a global whose name the scan cannot read", pos)
                target = global_name(pair[0], pair[1])
                if target not in ALLOWED:
                    raise refuse(f"a reference to {target}", pos, names=2)
                recent = [_UNKNOWN]
            elif op.name.startswith("EXT"):
                raise refuse("an extension-registry reference (copyreg)", pos)
            elif op.name in _STRINGS:
                text = arg.decode("latin-1") if isinstance(arg, bytes) else str(arg)
                recent = [*recent[-1:], text]
                texts = [*texts[-2:], text[:40]]
            elif op.name in _PUTS:  # stores the top of the stack; the stack is unchanged
                slot = slots if op.name == "MEMOIZE" else int(str(arg))
                slots += 1
                if slots > MAX_MEMO:
                    raise refuse(f"more than {MAX_MEMO} memoized values", pos)
                top = recent[-1] if recent else _UNKNOWN
                if isinstance(top, str):
                    memo[slot] = top
                else:
                    memo.pop(slot, None)
            elif op.name in _GETS:
                recent = [*recent[-1:], memo.get(int(str(arg)), _UNKNOWN)]
            elif op.name == "STOP":
                return ints
            elif op.name in ("FRAME", "PROTO"):  # framing and the header: no stack effect
                continue
            else:
                if op.name in _INTS and len(ints) < 2:
                    ints.append(arg)
                recent = [_UNKNOWN]  # anything else: the scan no longer knows the stack top
    except FormatError:
        raise
    except ValueError as err:  # genops: an unknown opcode, or bytes that end mid-pickle
        raise FormatError(
            f"{name}: expected a whole pickle, found {err} (truncated or corrupt); nothing "
            "was unpickled; fetch the file again",
        ) from None
    raise FormatError(f"{name}: expected a pickle ending in STOP, found none; fetch it again")


def _scan_zip(data: bytes, *, name: str) -> None:
    archive = zipread.read(data, name=name)  # the member torch.load would read, and only it
    where = f"{name}:{archive.prefix}/{zipread.PICKLE}"
    _one(archive.pickle, name=where)
    refs, _ = rebuilds.read(io.BytesIO(archive.pickle), name=where)
    rebuilds.check(refs, archive.storages, name=name)


def _scan_legacy(data: bytes, *, name: str) -> None:
    stream = io.BytesIO(data)
    for i in range(LEGACY_PICKLES):
        ints = _one(stream, name=name)
        if i == 0 and ints != [LEGACY_MAGIC]:
            raise FormatError(
                f"{name}: expected a torch.save file (a zip archive, or the legacy format "
                "that starts with torch's magic number), found a plain pickle; nothing was "
                "unpickled; " + ADVICE
            )
    stream.seek(0)
    refs, values = rebuilds.read(stream, name=name, legacy=True)
    stored = _legacy_storages(data, stream.tell(), values[-1], refs, name=name)
    rebuilds.check(refs, stored, name=name)


def _legacy_storages(
    data: bytes, start: int, keys: Any, refs: rebuilds.Refs, *, name: str
) -> dict[str, int]:
    """The storages after a legacy file's pickles, in ``keys`` order: each an 8-byte
    little-endian element count, then its bytes, up to the end of the file.

    Returns:
        Storage key -> bytes. Raises: FormatError (a key missing or repeated, a count
        not the pickle's, bytes past the end or left after it).
    """
    if not isinstance(keys, list) or sorted(keys, key=str) != sorted(refs.storages):
        raise rebuilds.refuse(
            name, f"the storage keys {sorted(refs.storages)[:3]}...", f"{keys!r:.80}"
        )
    stored, pos = {}, start
    for key in keys:
        dtype, numel = refs.storages[key]
        count = int.from_bytes(data[pos : pos + 8], "little", signed=True)
        size = numel * dtype.itemsize
        if count != numel or pos + 8 + size > len(data):
            raise rebuilds.refuse(
                name,
                f"storage {key!r}: {numel} x {dtype} at byte {pos}",
                f"a count of {count} and {len(data) - pos - 8} bytes left",
            )
        stored[key], pos = size, pos + 8 + size
    if pos != len(data):
        raise rebuilds.refuse(
            name,
            f"the file to end after its storages at byte {pos}",
            f"{len(data) - pos} more bytes",
        )
    return stored


def scan(data: bytes, *, name: str) -> str:
    """Check every pickle ``torch.load`` would read in ``data`` (a ``torch.save`` file).

    Returns:
        ``"zip"`` or ``"legacy"``: the file's layout.

    Raises:
        FormatError: it is neither layout, is truncated or corrupt, references a global
            outside :data:`ALLOWED`, is an archive torch's reader could read otherwise
            (:mod:`~recovery.format.zipread`), or states tensors past, across or beyond
            the storages it holds (:mod:`~recovery.format.rebuilds`); torch read nothing.
    """
    if data[:4] == b"PK\x03\x04":
        _scan_zip(data, name=name)
        return "zip"
    if data[:1] == b"\x80":  # a pickle's PROTO opcode
        _scan_legacy(data, name=name)
        return "legacy"
    raise FormatError(
        f"{name}: expected a torch.save file (a zip archive or a pickle), found "
        f"{len(data)} bytes starting {data[:8]!r}; it is not a PyTorch checkpoint"
    )


def load(data: bytes, *, name: str) -> Any:
    """:func:`scan` ``data``, then ``torch.load`` those same bytes with ``weights_only=True``
    onto the CPU (from memory: a path could be swapped between the scan and the load).

    Raises:
        FormatError: as :func:`scan`, or ``torch.load`` refused or failed on it.
    """
    scan(data, name=name)
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FormatError(
            f"{name}: expected a torch.save file that torch.load(weights_only=True) reads, "
            f"found it refused or failed ({type(err).__name__}: {first[:200]}); " + ADVICE
        ) from None
