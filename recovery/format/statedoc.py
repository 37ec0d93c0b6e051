"""``state.json``, the document that says what a checkpoint's files are, read without torch.

It holds the state format, the step, every component's skeleton (its tensors
as ``{"__tensor__": key}`` references into the component's tensor file,
:mod:`recovery.format.codec`), a delta's record of patched tables, and the
metadata saved beside (run id, metrics, ...). The decoder
(:func:`recovery.state.snapshot.decode`) and the hash-only verification of
``recovery ls`` and ``recovery verify`` (:func:`recovery.run.restoring.choose.check`)
both parse and check it here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recovery.errors import FormatError
from recovery.format import bounded
from recovery.format.layout import (
    CONFIG_FILE,
    DISTRIBUTED,
    IO_SIGNATURE_FILE,
    PROGRAM_FILE,
    STATE_FILE,
)

STATE_FORMAT = 1
DIFFERENTIAL = "differential"
"""``state.json`` key of a delta: per component, the tables stored as changed rows
(:func:`recovery.format.delta.diff`), patched onto its base's on decode."""
MODEL_CONFIG = "model_config"
ROWS = "__delta__/rows/"
VALUES = "__delta__/values/"
"""A delta's stored tensors of a patched table: its changed rows' indexes and values."""
TENSOR_TAG = "__tensor__"
"""A skeleton's reference to a tensor of its component's file."""


def parse(raw: bytes | None, where: Path) -> dict[str, Any]:
    """The state document of the checkpoint ``where`` from the verified bytes of its
    ``state.json`` (``None``: it holds none), its format and its delta record checked.

    Raises:
        FormatError: naming the file, no ``state.json``, not JSON, another state format,
            or a malformed delta record.
    """
    file = where / STATE_FILE
    if raw is None:
        raise FormatError(
            f"{where}: has no {STATE_FILE}; it is not a training checkpoint", path=where
        )
    try:
        doc = bounded.json_loads(raw)
    except ValueError as err:
        raise FormatError(f"{file}: expected JSON, found undecodable bytes ({err})") from err
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
        raise FormatError(
            f"{file}: expected state format {STATE_FORMAT}, "
            f"found {doc.get('format') if isinstance(doc, dict) else type(doc).__name__}",
            path=file,
        )
    patched(doc, where=file)
    return doc


def meta(doc: dict[str, Any]) -> dict[str, Any]:
    """What ``state.json`` holds beside the format, the step and the components."""
    return {k: v for k, v in doc.items() if k not in ("format", "step", "components")}


def patched(doc: dict[str, Any], *, where: Any) -> dict[str, Any]:
    """A delta's patched tables by component (``{}`` for a full checkpoint), its record
    checked whole: ``sequence`` an int >= 1, ``tables`` ``{component: {key: {"changed":
    int, "rows": int}}}``.

    Raises:
        FormatError: naming ``state.json``, the record is malformed.
    """
    if DIFFERENTIAL not in doc:
        return {}
    record = doc[DIFFERENTIAL]
    tables = record.get("tables") if isinstance(record, dict) else None
    sequence = record.get("sequence") if isinstance(record, dict) else None

    def counts(entry: Any) -> bool:
        return isinstance(entry, dict) and all(
            type(entry.get(k)) is int and entry[k] >= 0 for k in ("changed", "rows")
        )

    ok = (
        type(sequence) is int
        and sequence >= 1
        and isinstance(tables, dict)
        and all(isinstance(t, dict) and all(counts(e) for e in t.values()) for t in tables.values())
    )
    if not ok or not isinstance(tables, dict):
        raise FormatError(
            f"{where}: malformed {DIFFERENTIAL} record (expected sequence >= 1 and tables "
            "{component: {key: {changed, rows}}}); resume from another checkpoint",
            path=where,
        )
    return tables


def tensor_refs(skeleton: Any) -> set[str]:
    """The tensor keys a component's skeleton references (each must be in its file)."""
    found: set[str] = set()
    stack = [skeleton]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if TENSOR_TAG in node:
                found.add(str(node[TENSOR_TAG]))
            else:
                stack.extend(node.values())
    return found


def present(
    components: Any, meta: dict[str, Any], files: Any, statement: dict[str, Any]
) -> list[str]:
    """The purpose-contract components an artifact holds.

    State components (``model``, ``optimizer``, ...: the names of ``components``)
    plus ``config`` (a ``config.yaml``), ``model_config`` (in ``state.json``),
    ``provenance`` and ``lineage`` (in the signed statement).
    """
    names = set(components)
    spread = meta.get(DISTRIBUTED)
    if isinstance(spread, dict):  # a distributed checkpoint's DCP and per-rank parts
        names.update(spread.get("sharded", []), spread.get("per_rank", []))
    if CONFIG_FILE in files:
        names.add("config")
    if IO_SIGNATURE_FILE in files:
        names.add("io_signature")
    if PROGRAM_FILE in files:
        names.add("program")
    if meta.get(MODEL_CONFIG) is not None:
        names.add(MODEL_CONFIG)
    for key in ("provenance", "lineage"):
        if statement.get(key):
            names.add(key)
    return sorted(names)
