"""Verification without decoding: what ``recovery ls`` and ``recovery verify`` show, no torch.

:func:`check` verifies everything :func:`recovery.run.restoring.choose.load` verifies of
a checkpoint (and of a delta's base) except what only decoding tensors can
see: signature, trust, every file's size and digest, that ``state.json``
claims every listed file (:func:`recovery.integrity.reads.hashonly.check`); the state
document and the structure the decoder would refuse, from the tensor files'
headers (:func:`recovery.format.tensorrefs.check`), and a delta's row indexes from
their verified bytes (in range, ascending, unique); the purpose contract. It never
deserialises a tensor, so it never imports torch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from recovery.format import statedoc, tensorrefs
from recovery.format.layout import STATE_FILE
from recovery.format.manifest import Manifest
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import chain, hashonly
from recovery.provenance import purpose
from recovery.storage import tracking

log = logging.getLogger(__name__)


class _Dir(Protocol):
    @property
    def path(self) -> Path: ...

    @property
    def manifest(self) -> Manifest: ...


@dataclass(frozen=True)
class Checked:
    """A verified artifact whose tensors were not decoded (:func:`check`)."""

    path: Path
    manifest: Manifest
    step: int
    meta: dict[str, Any]
    """``state.json`` beside its format, step and components (metrics, run id, ...)."""
    components: list[str]
    """The purpose-contract components it holds."""
    documents: dict[str, bytes] = field(repr=False)
    """The verified bytes of its JSON and YAML files (``state.json``, ``config.yaml``...)."""
    links: list[hashonly.Checked] = field(repr=False, default_factory=list)
    """A delta's checked chain of bases, the full checkpoint first (empty: a full one)."""

    @property
    def delta(self) -> dict[str, Any] | None:
        """What a delta is (:func:`delta_of`; ``None``: a full checkpoint)."""
        return delta_of(self.meta, self.manifest, self.links)


def check(path: Path, trust: TrustStore, *, allow_untrusted: bool = False) -> Checked:
    """Verify all that :func:`recovery.run.restoring.choose.load` verifies of ``path`` (see the
    module), decoding no tensor.

    Raises:
        What :func:`recovery.run.restoring.choose.load` raises, for the same failures.
    """
    checked = hashonly.check(path, trust, allow_untrusted=allow_untrusted)
    mf = checked.manifest
    links = chain.read_chain(
        path,
        mf,
        lambda p: hashonly.check(p, trust, allow_untrusted=allow_untrusted),
        fetch=fetch_base,
    )
    doc = statedoc.parse(checked.document(STATE_FILE), path)
    theirs = [(b.path, b.header, b.document, b.row_bytes) for b in links]
    tensorrefs.check(path, doc, checked.header, checked.document, theirs, checked.row_bytes)
    meta = statedoc.meta(doc)
    have = contract(path, mf, doc["components"], meta, {r.name for r in mf.files})
    return Checked(path, mf, int(doc["step"]), meta, have, checked.documents, links)


def fetch_base(path: Path, mf: Manifest) -> None:
    """Fetch a delta's base from DVC when it is only tracked there (a full checkpoint, or
    a base on disk: nothing to do)."""
    named = chain.base_of(mf, path)
    if named is not None:
        where = chain.base_path(path, named)
        if not where.is_dir() and tracking.dvc_file(where).exists():
            log.info("%s: its base %s is not on disk; fetching it from DVC", path, where.name)
            tracking.materialize(where)


def contract(
    path: Path, mf: Manifest, components: Any, meta: dict[str, Any], files: Any
) -> list[str]:
    """The purpose-contract components the artifact holds, its contract checked.

    Raises:
        PurposeError.
    """
    rec = mf.recovery
    have = statedoc.present(components, meta, files, rec)
    purpose.check_contract(
        mf.purpose, rec.get("requires", []), have, where=str(path), absent=rec.get("absent")
    )
    return have


def delta_of(meta: dict[str, Any], mf: Manifest, links: Sequence[_Dir]) -> dict[str, Any] | None:
    """What a delta is (``None``: a full checkpoint): its base's name, step and digest, its
    place after the chain's full checkpoint, the chain (the full one first), its own bytes,
    its base's and its whole chain's, and per patched table (``component/key``) its changed
    and total rows."""
    if not links:
        return None
    base = links[-1]
    record = meta.get(statedoc.DIFFERENTIAL) or {}
    tables = {
        f"{name}/{key}": [int(t["changed"]), int(t["rows"])]
        for name, patched in (record.get("tables") or {}).items()
        for key, t in patched.items()
    }
    return {
        "base": base.path.name,
        "base_step": base.manifest.step,
        "base_sha256": base.manifest.root,
        "sequence": record.get("sequence"),
        "chain": [link.path.name for link in links],
        "bytes": sum(r.size for r in mf.files),
        "base_bytes": sum(r.size for r in base.manifest.files),
        "chain_bytes": sum(r.size for link in links for r in link.manifest.files),
        "full_bytes": sum(r.size for r in links[0].manifest.files),
        "tables": tables,
    }


def signer(mf: Manifest) -> dict[str, Any] | None:
    """Who signed a verified artifact: key id, trust, dev key, where the key came from."""
    check = mf.signer
    if check is None:
        return None
    dev = check.dev or bool((mf.recovery.get("signer") or {}).get("dev"))
    return {"key_id": check.key_id, "trusted": check.trusted, "dev": dev, "source": check.source}


def signer_text(signer: dict[str, Any] | None) -> str:
    """:func:`signer` in words: ``63f7f2ef1a2b (dev key, trusted)``."""
    if not signer:
        return "unsigned"
    tags = [
        t for t, on in (("dev key", signer.get("dev")), ("trusted", signer.get("trusted"))) if on
    ]
    if not signer.get("trusted"):
        tags.append("UNTRUSTED")
    return f"{str(signer.get('key_id'))[:12]} ({', '.join(tags)})"
