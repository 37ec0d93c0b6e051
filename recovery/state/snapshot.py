"""A state tree <-> the files of one checkpoint directory.

Each component's tensors go to ``<component>.safetensors`` (so the model's
weights are a plain safetensors file any tool can read), or, past the shard
size, to Hugging Face-style shards and their index (:mod:`recovery.format.shards`);
every component's
non-tensor skeleton, the step and the metrics go to ``state.json``; the
resolved config, when given, to ``config.yaml``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from recovery.errors import FormatError
from recovery.format import codec, delta, shards, statedoc, tensorfile, tensorrefs
from recovery.format.layout import (
    CONFIG_FILE,
    STATE_FILE,
    tensor_file,
)
from recovery.integrity.reads.reader import Deferred, Verified

STATE_FORMAT = statedoc.STATE_FORMAT
DIFFERENTIAL = statedoc.DIFFERENTIAL
MODEL_CONFIG = statedoc.MODEL_CONFIG


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


def decode(verified: Verified, bases: Sequence[Verified] = ()) -> Decoded:
    """Rebuild the state tree from verified bytes (a delta's with its verified chain of
    ``bases``, the full checkpoint first: :func:`recovery.integrity.reads.chain.read_chain`).

    Raises:
        FormatError: naming the file that does not decode, or a delta given no base.
    """
    where = verified.path
    doc, patched = _patched(verified)
    if DIFFERENTIAL in doc and not bases:
        raise FormatError(
            f"{where / STATE_FILE}: is a delta; it decodes only with its base checkpoint",
            path=where / STATE_FILE,
        )
    tree: dict[str, Any] = {}
    for name, skeleton in doc["components"].items():
        fname = tensor_file(name)
        flat = tensors(verified, name)
        if bases and patched.get(name):
            old = full_tensors(bases, name)
            flat = delta.patch(flat, old, patched[name], where=str(where / fname))
        try:
            tree[name] = codec.join(skeleton, flat)
        except FormatError as err:
            raise FormatError(f"{where / fname}: {err}", path=where / fname) from err
    return Decoded(tree=tree, step=int(doc["step"]), meta=statedoc.meta(doc))


def _patched(verified: Verified) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint's ``state.json`` and its patched tables by component (``{}``: full)."""
    raw = _bytes(verified, STATE_FILE) if STATE_FILE in verified.files else None
    doc = statedoc.parse(raw, verified.path)
    return doc, statedoc.patched(doc, where=verified.path / STATE_FILE)


def full_tensors(links: Sequence[Verified], component: str) -> dict[str, torch.Tensor]:
    """A component's whole tensors at the last of ``links`` (a chain, the full checkpoint
    first): the full one's, patched by each delta's rows in turn.

    Raises:
        FormatError: a link that does not patch the one before it.
    """
    flat = tensors(links[0], component)
    for link in links[1:]:
        _, patched = _patched(link)
        stored = tensors(link, component)
        tables = patched.get(component)
        where = str(link.path / tensor_file(component))
        flat = delta.patch(stored, flat, tables, where=where) if tables else stored
    return flat


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
            raise tensorrefs.missing_shard(iname, shard, where)
        got = tensorfile.views(data, name=str(where / shard))
        tensorrefs.check_shard(where / shard, got, keys)
        out.update(got)
    return dict(sorted(out.items()))


def present(
    tree: dict[str, Any], meta: dict[str, Any], files: Any, statement: dict[str, Any]
) -> list[str]:
    """The purpose-contract components an artifact holds (:func:`.statedoc.present`)."""
    return statedoc.present(tree, meta, files, statement)
