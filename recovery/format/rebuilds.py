"""The tensors a ``torch.save`` pickle would rebuild, read without building any, and held
to the storages the file holds before ``torch.load`` allocates anything.

``torch.load`` allocates each storage a persistent id names (stated count x element
size; the legacy format before reading a byte of it) and views it as each
``_rebuild_tensor_v2``/``_v3`` call says; the import then copies every view. So a
few hundred bytes could state 2^40 elements, or view 4 bytes with stride 0 as 2^33.

:func:`read` runs the pickle through :class:`pickle.Unpickler` with every global the
scan allows replaced by an inert stand-in (:meth:`_Reader.find_class`): the rebuild
functions record their arguments, a storage class the persistent id; dicts and sets
are plain. No torch object is built, nothing is imported. :func:`check` then bounds
what the import materialises by **the file's own size**:

- a storage's stated bytes equal the bytes the file holds for it (its zip member; in
  the legacy format, its count and bytes after the pickles);
- a view lies inside its storage and no two of its elements share memory (no stride 0
  over a dimension longer than 1, as an expanded tensor has; no overlapping strides);
- two views of one storage are the same view, or share no bytes (the slices of a
  fused ``qkv`` saved as three entries). The same view is how ``torch.save`` writes
  tied weights (``lm_head.weight`` is the embedding's) and the artifact stores it
  once; any other sharing (a transposed or partial second view of a weight) is
  refused: the artifact would hold those bytes twice, how a small file multiplies.
"""

from __future__ import annotations

import collections
import io
import itertools
import pickle
from dataclasses import dataclass, field
from typing import Any

import torch

from recovery.errors import FormatError
from recovery.format.tensorfile import DTYPES
from recovery.format.zipread import ADVICE, said

STORAGE_DTYPES: dict[str, torch.dtype] = {
    "torch.BFloat16Storage": torch.bfloat16,
    "torch.BoolStorage": torch.bool,
    "torch.ByteStorage": torch.uint8,
    "torch.CharStorage": torch.int8,
    "torch.DoubleStorage": torch.float64,
    "torch.FloatStorage": torch.float32,
    "torch.HalfStorage": torch.float16,
    "torch.IntStorage": torch.int32,
    "torch.LongStorage": torch.int64,
    "torch.ShortStorage": torch.int16,
    "torch.storage.UntypedStorage": torch.uint8,  # counted in bytes
}
"""The storage classes a persistent id may name, and the element each counts."""
MAX_TENSORS = 1 << 20
"""Most tensors and storages one pickle may rebuild (a large model has thousands)."""
MAX_PATHS = 1 << 20
"""Most containers walked to name the entry a refused tensor sits at."""


def global_name(module: str, attr: str) -> str:
    """``module.attr``; protocol 2 spells builtins the Python 2 way (the unpickler maps it)."""
    return f"{'builtins' if module == '__builtin__' else module}.{attr}"


_STORAGE_IDS = ("storage", b"storage")  # the legacy format may spell it as bytes


class _Crafted(Exception):
    """Raised by a stand-in: what the pickle does that ``torch.save`` never writes."""


@dataclass(frozen=True)
class View:
    """One ``_rebuild_tensor`` call: a view of a storage, in elements of ``dtype``."""

    key: str
    dtype: torch.dtype
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass
class Refs:
    """What a pickle would rebuild: storage key -> (element dtype, count), and the views."""

    storages: dict[str, tuple[torch.dtype, int]] = field(default_factory=dict)
    views: list[View] = field(default_factory=list)
    paths: dict[int, str] = field(default_factory=dict)
    """View index -> where in the object it sits (``['state_dict']['w']``)."""

    def where(self, index: int) -> str:
        return f"tensor {self.paths.get(index, f'#{index + 1}')}"


class _Inert:
    """A stand-in the pickle must not change: BUILD on it (which would set its attributes
    behind any frozen dataclass's back) is refused."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise _Crafted(f"a BUILD on {type(self).__name__.strip('_').lower()} ({state!r:.40})")


class _Storage(_Inert):
    """A storage a persistent id names: its key and element dtype."""

    __slots__ = ("dtype", "key")

    def __init__(self, key: str, dtype: torch.dtype) -> None:
        self.key, self.dtype = key, dtype


class _StorageType(_Inert):
    """A storage class the pickle names: the key to its element dtype. Never called."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any) -> Any:
        raise _Crafted(f"a call to {self.name} (a storage the pickle builds, not one read)")


class _Tensor:
    """Where a rebuilt tensor would be: the index of its view."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __setstate__(self, state: Any) -> None:  # BUILD on a tensor: nothing to keep
        pass


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(type(v) is int and v >= 0 for v in value):
        raise _Crafted(f"a {what} of {value!r:.60} (expected non-negative ints)")
    return value


def _encode(text: Any, encoding: Any = "utf-8") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Crafted(f"_codecs.encode({type(text).__name__}, {encoding!r:.20})")
    return text.encode("latin-1")


class _Reader(pickle.Unpickler):
    """:class:`pickle.Unpickler` whose globals are the stand-ins of :func:`read`."""

    def __init__(self, file: io.BytesIO, refs: Refs, *, ids: int) -> None:
        super().__init__(file, encoding="utf-8")
        self.refs, self.ids = refs, ids  # ids: persistent-id length (0: none expected)
        self.table: dict[str, Any] = {
            "collections.OrderedDict": collections.OrderedDict,
            "torch._utils._rebuild_tensor_v2": self._v2,
            "torch._utils._rebuild_tensor_v3": self._v3,
            "torch._utils._rebuild_parameter": lambda data, *_: data,
            "torch.Size": lambda dims=(): _ints(tuple(dims), "torch.Size"),
            "torch.device": lambda *args: str(args),
            "builtins.set": set,
            "builtins.frozenset": frozenset,
            "_codecs.encode": _encode,
            **{n: _StorageType(n) for n in STORAGE_DTYPES},
            **{str(dtype): dtype for dtype in DTYPES},  # a dtype object is inert
        }

    def find_class(self, module: str, name: str) -> Any:
        target = global_name(module, name)
        if target not in self.table:
            raise _Crafted(f"a reference to {target}")
        return self.table[target]

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or len(pid) != self.ids or pid[0] not in _STORAGE_IDS:
            raise _Crafted(f"a persistent id {pid!r:.80} (expected a storage's)")
        kind, numel, key = pid[1], pid[4], pid[2]
        if not isinstance(kind, _StorageType) or not isinstance(key, str) or type(numel) is not int:
            raise _Crafted(f"a storage id {pid!r:.80}")
        if numel < 0 or (len(pid) == 6 and pid[5] is not None):
            raise _Crafted(f"a storage of {numel} elements or a legacy storage view ({pid[5:]})")
        dtype = STORAGE_DTYPES[kind.name]
        if len(self.refs.storages) >= MAX_TENSORS and key not in self.refs.storages:
            raise _Crafted(f"more than {MAX_TENSORS} storages")
        if self.refs.storages.setdefault(key, (dtype, numel)) != (dtype, numel):
            first = self.refs.storages[key]
            raise _Crafted(f"storage {key!r} named as {first} and as {(dtype, numel)}")
        return _Storage(key, dtype)

    def _view(self, storage: Any, offset: Any, size: Any, stride: Any, dtype: Any) -> _Tensor:
        if not isinstance(storage, _Storage) or type(offset) is not int or offset < 0:
            kind = type(storage).__name__
            raise _Crafted(f"a tensor rebuilt from a {kind} at offset {offset!r:.20}")
        size, stride = _ints(size, "size"), _ints(stride, "stride")
        if len(size) != len(stride) or not isinstance(dtype, torch.dtype):
            raise _Crafted(f"a tensor of size {size} and stride {stride}")
        if len(self.refs.views) >= MAX_TENSORS:
            raise _Crafted(f"more than {MAX_TENSORS} tensors")
        self.refs.views.append(View(storage.key, dtype, offset, size, stride))
        return _Tensor(len(self.refs.views) - 1)

    def _v2(self, storage: Any, offset: Any, size: Any, stride: Any, *_: Any) -> _Tensor:
        return self._view(storage, offset, size, stride, getattr(storage, "dtype", None))

    def _v3(self, storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> _Tensor:
        return self._view(storage, offset, size, stride, rest[2] if len(rest) > 2 else None)


def _paths(obj: Any) -> dict[int, str]:
    """Where each stand-in tensor sits in ``obj`` (the first path found), walked
    iteratively (a pickle can nest deeper than recursion goes, or hold cycles)."""
    found: dict[int, str] = {}
    stack: list[tuple[Any, str]] = [(obj, "")]
    seen: set[int] = set()
    while stack and len(seen) < MAX_PATHS:
        node, path = stack.pop()
        if isinstance(node, _Tensor):
            found.setdefault(node.index, path or "<root>")
        elif isinstance(node, dict | list | tuple) and id(node) not in seen:
            seen.add(id(node))
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((v, f"{path}[{k!r}]") for k, v in reversed(list(items)))
    return found


def refuse(name: str, expected: str, found: str) -> FormatError:
    """A refusal of what the pickle states: one line, what to do included."""
    return FormatError(f"{name}: expected {expected}, found {found}; nothing was loaded; {ADVICE}")


def read(stream: io.BytesIO, *, name: str, legacy: bool = False) -> tuple[Refs, list[Any]]:
    """Read the pickle at ``stream`` (``legacy``: the five of the legacy format) with the
    stand-ins. Returns the storages and views, and what each pickle held (stand-ins in
    place of tensors).

    Raises:
        FormatError: a stand-in was misused, or the pickle does not read.
    """
    refs = Refs()
    values: list[Any] = []
    try:
        for i in range(5 if legacy else 1):
            ids = (6 if i == 3 else 0) if legacy else 5
            values.append(_Reader(stream, refs, ids=ids).load())
    except _Crafted as err:
        raise refuse(name, "what torch.save writes for a state dict", str(err)) from None
    except Exception as err:  # the stand-ins are all that runs: any error is a bad pickle
        raise refuse(name, "a pickle that reads", f"{type(err).__name__}: {said(err)}") from None
    refs.paths = _paths(values[-2] if legacy else values[0])
    return refs, values


def _extent(view: View) -> tuple[int, bool]:
    """Elements from a view's first to one past its last (0: empty), and whether no two
    of its elements share memory: each stride, smallest first, steps past everything
    the smaller ones reach (stride 0 over two or more elements never does)."""
    if 0 in view.size:
        return 0, True
    reach, distinct = 1, True
    for stride, n in sorted((s, n) for n, s in zip(view.size, view.stride, strict=True) if n > 1):
        distinct = distinct and stride >= reach
        reach += (n - 1) * stride
    return reach, distinct


def check(refs: Refs, stored: dict[str, int], *, name: str) -> None:
    """Hold ``refs`` to the storages the file holds (key -> bytes), as the module says.

    Raises:
        FormatError: naming the storage or tensor, what it states and what the file holds.
    """
    for key, (dtype, numel) in refs.storages.items():
        need, have = numel * dtype.itemsize, stored.get(key)
        if have != need:
            held = "none" if have is None else f"{have} bytes"
            raise refuse(
                name,
                f"storage {key!r} ({numel} x {dtype}) to hold {need} bytes of the file",
                f"{held} there",
            )
    if unused := sorted(set(stored) - set(refs.storages)):
        raise refuse(name, "a storage for each one the pickle names", f"unnamed {unused[:3]}")
    spans: dict[str, list[tuple[int, int, int]]] = {}
    first: dict[View, int] = {}
    for i, view in enumerate(refs.views):
        reach, distinct = _extent(view)
        dtype, numel = refs.storages[view.key]
        size, e, end = numel * dtype.itemsize, view.dtype.itemsize, view.offset + reach
        at = f"{refs.where(i)} (offset {view.offset}, size {view.size}, stride {view.stride})"
        if not distinct:
            raise refuse(
                name,
                f"{at} to hold each element in its own bytes",
                "an expanded or overlapping view",
            )
        if reach and end * e > size:
            raise refuse(
                name, f"{at} inside storage {view.key!r}", f"it reaches byte {end * e} of {size}"
            )
        if reach and first.setdefault(view, i) == i:  # the same view again: tied weights
            spans.setdefault(view.key, []).append((view.offset * e, end * e, i))
    for key, ranges in spans.items():
        ranges.sort()
        for (_, stop, i), (start, _, j) in itertools.pairwise(ranges):
            if start < stop:
                pair = f"{refs.where(j)} to share no bytes with {refs.where(i)} (or be its view)"
                raise refuse(name, pair, f"both use byte {start} of storage {key!r}")
