"""The tensors ``state.json`` refers to, checked against the tensor files' headers, no torch.

What the decoder (:func:`recovery.state.snapshot.decode`) would refuse about a
checkpoint's structure, found from the headers alone
(:mod:`recovery.format.safeheader`), with the decoder's messages: a component's
tensor file (or its shard index and shards, each shard holding exactly the
tensors its index says), a delta's patched tables (their stored rows and values
present, dtypes and shapes that fit the base's table, no stray rows), and every
``{"__tensor__": key}`` of a component's skeleton present. Used by
:func:`recovery.run.restoring.choose.check`, the hash-only verification of ``recovery ls``
and ``recovery verify``. The values of a delta's
row indexes are checked too (in range, ascending, unique) from their verified bytes,
when the caller kept them (:class:`recovery.integrity.reads.hashonly.Checked` does).
"""

from __future__ import annotations

import array
import itertools
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from recovery.errors import FormatError
from recovery.format import shards, statedoc
from recovery.format.layout import STATE_FILE, tensor_file
from recovery.format.safeheader import Entry
from recovery.format.statedoc import ROWS, VALUES

T = TypeVar("T")

Headers = Callable[[str], dict[str, Entry] | None]
"""A listed tensor file's checked header entries by tensor name (``None``: not listed)."""
Documents = Callable[[str], bytes | None]
"""A listed JSON file's verified bytes (``None``: not listed)."""
Rows = Callable[[str, str], bytes | None]
"""A tensor file's verified bytes of one delta row-index tensor, by (file, stored key)."""


def component(where: Path, name: str, headers: Headers, documents: Documents) -> dict[str, Entry]:
    """A component's tensors as its file's header (or its shards' headers) lists them.

    Raises:
        FormatError: a malformed index, a shard it names missing, or a shard holding
            other tensors than the index says.
    """
    own = headers(tensor_file(name))
    if own is not None:
        return own
    iname = shards.index_name(name)
    raw = documents(iname)
    if raw is None:
        return {}
    index = str(where / iname)
    out: dict[str, Entry] = {}
    for shard, keys in shards.shard_names(name, raw, where=index).items():
        got = headers(shard)
        if got is None:
            raise missing_shard(index, shard, where)
        check_shard(where / shard, got, keys)
        out.update(got)
    return out


Link = tuple[Path, Headers, Documents, Rows | None]
"""A checkpoint of a delta's chain: its path, headers, documents and (when kept) the
verified bytes of its row indexes."""


def check(
    where: Path,
    doc: dict[str, Any],
    headers: Headers,
    documents: Documents,
    bases: Sequence[Link],
    rows: Rows | None = None,
) -> None:
    """Refuse what decoding ``doc``'s components would refuse (see the module), a delta's
    against its chain of ``bases`` (the full checkpoint first), the row indexes' values
    too, its own and each link's, where ``rows`` (a link's fourth item) gives their
    verified bytes.

    Raises:
        FormatError: naming the file, with the decoder's message.
    """
    patched = statedoc.patched(doc, where=where / STATE_FILE)
    if statedoc.DIFFERENTIAL in doc and not bases:
        raise FormatError(
            f"{where / STATE_FILE}: is a delta; it decodes only with its base checkpoint",
            path=where / STATE_FILE,
        )
    for name, skeleton in doc["components"].items():
        fname = where / tensor_file(name)
        flat = component(where, name, headers, documents)
        if bases and patched.get(name):
            rows_of = _row_reader(where, name, headers, documents, rows)
            flat = _patch(
                flat, whole(bases, name), patched[name], where=str(fname), row_bytes=rows_of
            )
        for key in sorted(statedoc.tensor_refs(skeleton)):
            if key not in flat:
                raise FormatError(
                    f"{fname}: state references tensor '{key}', which the tensor file lacks",
                    path=fname,
                )


def _row_reader(
    where: Path, name: str, headers: Headers, documents: Documents, rows: Rows | None
) -> Callable[[str], bytes | None]:
    """The verified bytes of a component's stored row indexes, by key (``None``: not kept)."""
    files = component_files(where, name, headers, documents) if rows else []

    def stored_rows(key: str) -> bytes | None:
        found = (rows(f, key) for f in files) if rows is not None else iter(())
        return next((b for b in found if b is not None), None)

    return stored_rows


def whole(links: Sequence[Link], name: str) -> dict[str, Entry]:
    """A component's tensors at the last of ``links`` (a chain, the full checkpoint first)
    as the decoder would rebuild them: the full one's, patched by each delta in turn, each
    link's row indexes checked as the decoder checks them.

    Raises:
        FormatError: a link that does not patch the one before it.
    """
    where, headers, documents, _ = links[0]
    flat = component(where, name, headers, documents)
    for where, headers, documents, rows in links[1:]:
        stored = component(where, name, headers, documents)
        doc = statedoc.parse(documents(STATE_FILE), where)
        tables = statedoc.patched(doc, where=where / STATE_FILE).get(name)
        if tables:
            rows_of = _row_reader(where, name, headers, documents, rows)
            flat = _patch(
                stored, flat, tables, where=str(where / tensor_file(name)), row_bytes=rows_of
            )
        else:
            flat = stored
    return flat


def _patch(
    stored: dict[str, Entry],
    base: dict[str, Entry],
    tables: Any,
    *,
    where: str,
    row_bytes: Callable[[str], bytes | None],
) -> dict[str, Entry]:
    """``stored`` as the decoder's :func:`recovery.format.delta.patch` would leave it,
    checked from the headers."""
    if not isinstance(tables, dict):
        raise FormatError(f"{where}: expected a mapping of patched tables, found {tables!r}")
    if not tables:
        return stored
    out = {k: v for k, v in stored.items() if not k.startswith((ROWS, VALUES))}
    for key in tables:
        rows, values, old = table_parts(stored, base, key, where=where)
        problem = None
        if len(old.shape) < 1:
            problem = f"its base tensor has no rows (shape {list(old.shape)})"
        elif rows.dtype != "I64" or len(rows.shape) != 1:
            problem = (
                f"rows must be a 1-D I64 tensor, found {rows.dtype} of shape {list(rows.shape)}"
            )
        elif values.dtype != old.dtype or values.shape != (rows.shape[0], *old.shape[1:]):
            problem = (
                f"values of {values.dtype} {list(values.shape)}, expected {old.dtype} "
                f"{[rows.shape[0], *old.shape[1:]]}"
            )
        data = row_bytes(ROWS + key) if problem is None else None
        if data is not None:
            problem = row_values(data, old.shape[0])
        if problem is not None:
            raise FormatError(f"{where}: patched table {key!r}: {problem}")
        out[key] = old
    no_stray(stored, tables, where=where)
    return out


def row_values(data: bytes, rows: int) -> str | None:
    """What is wrong with a delta's row indexes (``data``: little-endian int64) for a table
    of ``rows`` rows, in the decoder's words and order; ``None``: in range, ascending and
    unique."""
    index = array.array("q")
    index.frombytes(data[: len(data) - len(data) % 8])
    if sys.byteorder == "big":
        index.byteswap()
    if len(index) and (index[0] < 0 or index[-1] >= rows):
        return f"rows outside 0..{rows - 1}"
    if any(b <= a for a, b in itertools.pairwise(index)):
        return "rows not ascending and unique"
    return None


def component_files(where: Path, name: str, headers: Headers, documents: Documents) -> list[str]:
    """The tensor files holding a component: its own file, or the shards its index names."""
    if headers(tensor_file(name)) is not None:
        return [tensor_file(name)]
    iname = shards.index_name(name)
    raw = documents(iname)
    return [] if raw is None else list(shards.shard_names(name, raw, where=str(where / iname)))


def table_parts(
    stored: Mapping[str, T], base: Mapping[str, T], key: str, *, where: str
) -> tuple[T, T, T]:
    """A patched table's stored rows and values, and its base tensor (or their entries).

    Raises:
        FormatError: naming ``where``, one of them is missing.
    """
    rows, values, old = stored.get(ROWS + key), stored.get(VALUES + key), base.get(key)
    if rows is None or values is None:
        raise FormatError(f"{where}: patched table {key!r} has no stored rows or values")
    if old is None:
        raise FormatError(
            f"{where}: patched table {key!r} is not in the base checkpoint; the delta and "
            "its base do not belong together"
        )
    return rows, values, old


def no_stray(stored: Iterable[str], tables: Mapping[str, Any], *, where: str) -> None:
    """Refuse stored delta rows or values of a table ``state.json`` does not list.

    Raises:
        FormatError: naming ``where`` and the first such table.
    """
    unknown = {k[len(p) :] for k in stored for p in (ROWS, VALUES) if k.startswith(p)}
    if stray := sorted(unknown - set(tables)):
        raise FormatError(
            f"{where}: holds delta rows of {stray[0]!r}, which state.json does not list"
        )


def missing_shard(index: str, shard: str, where: Path) -> FormatError:
    """The error for a shard an index names that the checkpoint does not hold."""
    return FormatError(
        f"{index}: names shard {shard}, which the checkpoint does not hold; "
        "resume from another checkpoint",
        path=where / shard,
    )


def check_shard(shard: Path, got: Iterable[str], keys: Iterable[str]) -> None:
    """Refuse a shard holding other tensors (``got``) than its index lists (``keys``).

    Raises:
        FormatError: naming the shard and the first difference.
    """
    got, keys = sorted(got), sorted(keys)
    if got != keys:
        raise FormatError(
            f"{shard}: holds {len(got)} tensors, its index lists {len(keys)} "
            f"(first difference: {sorted(set(got) ^ set(keys))[0]!r}); the shards and "
            "their index disagree",
            path=shard,
        )
