"""Which files of a committed directory its ``state.json`` claims.

The signed manifest says which bytes a directory holds; ``state.json`` says
what they are. A file the manifest lists but nothing in ``state.json`` gives a
meaning (a key holder re-signed the directory with a file added, or a tool
that is not this one wrote it) is never read by a decoder, so a verification
that only checked the manifest would pass it on unnoticed: every reader
refuses it instead (:func:`recovery.integrity.reads.reader.read_verified`).

A listed file is claimed by

- a role: ``state.json`` itself and ``config.yaml``; in an inference artifact
  (``state.json`` has ``export``) also ``program.pt2`` and ``signature.json``;
- a component named in ``state.json``'s ``components``: its
  ``<component>.safetensors``, or its shard index and the shards the index names
  (:func:`recovery.format.shards.shard_names`);
- a distributed checkpoint's record (``state.json``'s ``distributed``): DCP's
  ``dcp/.metadata`` and ``dcp/__<rank>_<n>.distcp``, and
  ``ranks/rank-<rank>.{json,safetensors}``, for each rank below its world size.

Nothing here reads tensors: only the JSON of ``state.json`` and of the indexes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from recovery.errors import ExtraFileError
from recovery.format import bounded, shards
from recovery.format.layout import (
    CONFIG_FILE,
    DCP_DIR,
    DISTRIBUTED,
    IO_SIGNATURE_FILE,
    PROGRAM_FILE,
    RANK_DIR,
    STATE_FILE,
    TENSOR_SUFFIX,
    tensor_file,
)

EXPORT = "export"
"""``state.json`` key of an inference artifact (:mod:`recovery.tools.export`)."""

_DCP = re.compile(rf"^{re.escape(DCP_DIR)}/(?:\.metadata|__(\d+)_\d+\.distcp)$")
_RANK = re.compile(rf"^{re.escape(RANK_DIR)}/rank-(\d{{5}})(?:\.json|{re.escape(TENSOR_SUFFIX)})$")


def check(directory: Path, names: Iterable[str], read: Callable[[str], bytes | None]) -> None:
    """Refuse a directory whose manifest lists a file ``state.json`` does not claim
    (:func:`unclaimed`; nothing is refused without a ``state.json`` of this tool's).

    Raises:
        ExtraFileError: naming the unclaimed files, what was expected and what to do.
        FormatError: a malformed shard index.
    """
    extra = unclaimed(names, read, where=str(directory))
    if extra:
        raise ExtraFileError(
            f"{directory}: its signed manifest lists {extra}, which no component, shard index "
            f"or role in its {STATE_FILE} claims; expected only {STATE_FILE}, {CONFIG_FILE} "
            f"and the files {STATE_FILE} names (each component's tensor file, or its shards "
            "and their index; a distributed checkpoint's dcp/ and ranks/ files; an inference "
            "artifact's program and signature). A file was added and the directory signed "
            "again; remove it if you know it, or resume from another checkpoint.",
            path=directory / extra[0],
        )


def unclaimed(
    names: Iterable[str], read: Callable[[str], bytes | None], *, where: str
) -> list[str] | None:
    """The listed ``names`` that ``state.json`` does not claim, sorted.

    Args:
        names: every file the manifest lists.
        read: the verified bytes of a listed JSON file (``state.json``, a shard index),
            ``None`` for a name not listed.
        where: the directory, for the messages.

    Returns:
        The unclaimed names (``[]``: all claimed), or ``None`` when there is no
        ``state.json`` holding a ``components`` mapping: not this tool's state
        document, which its decoder refuses (:func:`recovery.state.snapshot.decode`).

    Raises:
        FormatError: a component's shard index is malformed (naming it), as the
            decoder would say.
    """
    listed = set(names)
    doc = _state(read(STATE_FILE)) if STATE_FILE in listed else None
    if doc is None:
        return None
    claimed = {STATE_FILE, CONFIG_FILE}
    if EXPORT in doc:
        claimed |= {PROGRAM_FILE, IO_SIGNATURE_FILE}
    for component in doc["components"]:
        claimed.add(tensor_file(str(component)))
        index = shards.index_name(str(component))
        raw = read(index) if index in listed else None
        if raw is not None:
            claimed.add(index)
            claimed.update(shards.shard_names(str(component), raw, where=f"{where}/{index}"))
    ranks = _world_size(doc.get(DISTRIBUTED))
    for name in listed - claimed:
        found = _DCP.match(name) or _RANK.match(name)
        if found and int(found.group(1) or 0) < ranks:
            claimed.add(name)
    return sorted(listed - claimed)


def _state(raw: bytes | None) -> dict[str, Any] | None:
    """The parsed ``state.json``, or ``None`` when it is not a mapping with ``components``."""
    if raw is None:
        return None
    try:
        doc = bounded.json_loads(raw)
    except (UnicodeDecodeError, ValueError):  # the decoder names what is wrong
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("components"), dict):
        return None
    return doc


def _world_size(record: object) -> int:
    """The ranks a distributed record covers (0: not a distributed checkpoint)."""
    size = record.get("world_size") if isinstance(record, dict) else None
    return size if type(size) is int and size > 0 else 0
