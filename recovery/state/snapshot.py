"""A state tree <-> the files of one checkpoint directory.

Each component's tensors go to ``<component>.safetensors`` (so the model's
weights are a plain safetensors file any tool can read), or, past the shard
size, to Hugging Face-style shards and their index (:mod:`recovery.format.shards`);
every component's
non-tensor skeleton, the step and the metrics go to ``state.json``; the
resolved config, when given, to ``config.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from recovery.errors import FormatError
from recovery.format import codec, delta, shards, tensorfile
from recovery.format.layout import (
    CONFIG_FILE,
    DISTRIBUTED,
    IO_SIGNATURE_FILE,
    PROGRAM_FILE,
    STATE_FILE,
    tensor_file,
)
from recovery.integrity.reader import Deferred, Verified

STATE_FORMAT = 1
DIFFERENTIAL = "differential"
"""``state.json`` key of a delta: per component, the tables stored as changed rows
(:func:`recovery.format.delta.diff`), patched onto its base's on decode."""


@dataclass(frozen=True)
class Decoded:
    """A checkpoint's state tree and the metadata stored beside it."""

    tree: dict[str, Any]
    step: int
    meta: dict[str, Any]


def encode(
    tree: dict[str, Any],
    *,
    step: int,
    meta: dict[str, Any],
    config_yaml: str | None = None,
    shard_bytes: int = 0,
) -> dict[str, bytes | dict[str, torch.Tensor]]:
    """Lay a state tree out as files (see :func:`encode_split`), without copying tensors."""
    skeletons: dict[str, Any] = {}
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    for name, state in tree.items():
        skeletons[name], tensors[name] = codec.split(state)
    return encode_split(
        skeletons, tensors, step=step, meta=meta, config_yaml=config_yaml, shard_bytes=shard_bytes
    )


def encode_split(
    skeletons: dict[str, Any],
    tensors: dict[str, dict[str, torch.Tensor]],
    *,
    step: int,
    meta: dict[str, Any],
    config_yaml: str | None = None,
    shard_bytes: int = 0,
) -> dict[str, bytes | dict[str, torch.Tensor]]:
    """Lay out already-split components as files: tensor files first (tensor mappings,
    streamed by the committer), then ``state.json`` and ``config.yaml``.

    Args:
        skeletons: component name -> JSON-able skeleton.
        tensors: component name -> its tensors.
        step: the global step this state is at.
        meta: JSON-able extra fields for ``state.json`` (run id, metrics, ...).
        config_yaml: the resolved config text, if any.
        shard_bytes: a component with more tensor bytes than this is written as shards
            and an index; 0 writes one file per component.
    """
    files: dict[str, bytes | dict[str, torch.Tensor]] = {}
    for name, ts in tensors.items():
        if ts:
            files.update(shards.files(name, ts, shard_bytes))
    doc = {"format": STATE_FORMAT, "step": step, "components": skeletons, **meta}
    files[STATE_FILE] = codec.dumps_json(doc)
    if config_yaml is not None:
        files[CONFIG_FILE] = config_yaml.encode()
    return files


def decode(verified: Verified, base: Verified | None = None) -> Decoded:
    """Rebuild the state tree from verified bytes (a delta's with its verified ``base``).

    Raises:
        FormatError: naming the file that does not decode, or a delta given no base.
    """
    where = verified.path
    if STATE_FILE not in verified.files:
        raise FormatError(
            f"{where}: has no {STATE_FILE}; it is not a training checkpoint", path=where
        )
    doc = codec.loads_json(_bytes(verified, STATE_FILE), name=str(where / STATE_FILE))
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
        raise FormatError(
            f"{where / STATE_FILE}: expected state format {STATE_FORMAT}, "
            f"found {doc.get('format') if isinstance(doc, dict) else type(doc).__name__}",
            path=where / STATE_FILE,
        )
    patched = _patched(doc, where=where / STATE_FILE)
    if DIFFERENTIAL in doc and base is None:
        raise FormatError(
            f"{where / STATE_FILE}: is a delta; it decodes only with its base checkpoint",
            path=where / STATE_FILE,
        )
    tree: dict[str, Any] = {}
    for name, skeleton in doc["components"].items():
        fname = tensor_file(name)
        flat = tensors(verified, name)
        if base is not None and patched.get(name):
            flat = delta.patch(flat, tensors(base, name), patched[name], where=str(where / fname))
        try:
            tree[name] = codec.join(skeleton, flat)
        except FormatError as err:
            raise FormatError(f"{where / fname}: {err}", path=where / fname) from err
    meta = {k: v for k, v in doc.items() if k not in ("format", "step", "components")}
    return Decoded(tree=tree, step=int(doc["step"]), meta=meta)


def _patched(doc: dict[str, Any], *, where: Any) -> dict[str, Any]:
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


def _bytes(verified: Verified, name: str) -> bytes:
    """The verified bytes of a file read whole (a deferred one is verified now)."""
    blob = verified.files[name]
    if isinstance(blob, Deferred):
        blob = blob.read()
    return blob if isinstance(blob, bytes) else bytes(blob.numpy())


def tensors(verified: Verified, component: str) -> dict[str, torch.Tensor]:
    """A component's tensors, zero-copy over the verified bytes: its one file, or its
    shards as its index lists them (every tensor in the shard the index names).

    Raises:
        FormatError: a malformed index, a shard it names missing, or a shard holding
            other tensors than the index says.
    """
    where = verified.path
    fname = tensor_file(component)
    blob = verified.files.get(fname)
    if isinstance(blob, torch.Tensor):
        return tensorfile.views(blob, name=str(where / fname))
    index = verified.files.get(shards.index_name(component))
    if index is None:
        return {}
    iname = str(where / shards.index_name(component))
    raw = _bytes(verified, shards.index_name(component))
    out: dict[str, torch.Tensor] = {}
    for shard, keys in shards.shard_names(component, raw, where=iname).items():
        data = verified.files.get(shard)
        if not isinstance(data, torch.Tensor):
            raise FormatError(
                f"{iname}: names shard {shard}, which the checkpoint does not hold; "
                "resume from another checkpoint",
                path=where / shard,
            )
        got = tensorfile.views(data, name=str(where / shard))
        if sorted(got) != sorted(keys):
            raise FormatError(
                f"{where / shard}: holds {len(got)} tensors, its index lists {len(keys)} "
                f"(first difference: {sorted(set(got) ^ set(keys))[0]!r}); the shards and "
                "their index disagree",
                path=where / shard,
            )
        out.update(got)
    return dict(sorted(out.items()))


MODEL_CONFIG = "model_config"


def present(
    tree: dict[str, Any], meta: dict[str, Any], files: Any, statement: dict[str, Any]
) -> list[str]:
    """The purpose-contract components an artifact holds.

    State components (``model``, ``optimizer``, ...) plus ``config`` (a
    ``config.yaml``), ``model_config`` (in ``state.json``), ``provenance`` and
    ``lineage`` (in the signed statement).
    """
    names = set(tree)
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
