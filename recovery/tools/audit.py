"""Audit: verify an artifact and walk its lineage back to the start of the run that made it.

The walk follows each artifact's ``previous`` link; an artifact that is still
on disk is verified in full (signature, trust, hashes, purpose contract) and
the walk continues from its own links. The walk ends at an imported artifact
(``recovery import``), marked ``imported`` with its origin unverified: its
weights came from outside, with no run before them. Checkpoints deleted by
retention are shown as ``pruned`` with the digest recorded for them, and the
walk jumps to the start of the run segment they belonged to (the checkpoint
that segment resumed or was warm-started from), using the ``lineage`` list
every artifact carries. It ends at the segment that started fresh.

Artifacts are found by digest, not by name, under the checkpoint root (by
default the directory above the artifact's run directory), or where the link
records them when the root holds none with that digest (an imported artifact
under any name, or outside the root), so a renamed or replaced directory is
never mistaken for the one that was recorded, and a checkpoint of an
abandoned branch (moved to ``<run>/abandoned/<branch>/`` when the run resumed
from an earlier step) is found where it lies now. Such a checkpoint, the
target or a link, is audited like any other and marked
``abandoned`` (branch, run directory). The target is verified first; the root
is indexed only when there is a link to follow, by
:func:`~recovery.tools.audit_index.index`, whose walk is bounded, stays under
the root (links are never followed) and skips, with a one-line warning each,
whatever it cannot read, so one bad entry elsewhere cannot sink the audit.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.errors import RecoveryError
from recovery.format.layout import SIGNATURE_FILE
from recovery.format.manifest import Manifest
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import chain
from recovery.provenance.lineage import PROMOTED_FROM
from recovery.run.restoring import certificate, checked
from recovery.tools.audit_index import (
    Index,
    abandoned_of,
    at_recorded,
    default_root,
    index,
    retired_at,
    run_dir_of,
)

__all__ = [
    "FAILED",
    "OK",
    "PRUNED",
    "Index",
    "Link",
    "Report",
    "abandoned_of",
    "audit",
    "default_root",
    "index",
    "run_dir_of",
]

log = logging.getLogger(__name__)

OK = "ok"
PRUNED = "pruned"
FAILED = "failed"


@dataclass
class Link:
    """One artifact in the chain."""

    relation: str
    """How the previous (newer) link reached it: self, previous, resume, warm_start."""
    name: str
    step: int | None
    sha256: str | None
    status: str
    path: str | None = None
    purpose: str | None = None
    run_id: str | None = None
    signer: dict[str, Any] | None = None
    code: dict[str, Any] | None = None
    dataset: str | None = None
    dataset_stage: dict[str, Any] | None = None
    """The DVC stage that makes the dataset was out of date when the run started (its
    ``name`` and what ``outdated`` it); the data itself is what ``dataset`` says."""
    world_size: int | None = None
    """How many ranks wrote it (``torchrun``); 1 for a single process."""
    resharded: dict[str, Any] | None = None
    """On a resume link: the world size changed there (``from``, ``to``)."""
    drift: list[str] = field(default_factory=list)
    """What changed between this link and the newer one above it (code, dependencies, ...)."""
    abandoned: dict[str, str] | None = None
    """Found in a run's ``abandoned/<branch>/``: ``branch``, ``run_dir`` (moved out of it)."""
    imported: dict[str, Any] | None = None
    """Weights ``recovery import`` brought in: the source's ``kind``, ``source`` path and
    ``sha256``, and ``origin`` ``unverified`` (nothing vouches for who produced them)."""
    base: dict[str, Any] | None = None
    """A delta's base (``name``, ``step``, ``digest``), verified with it."""
    retired_at: int | None = None
    """A ``pruned`` link that its run's retention deleted (the run's sealed journal says
    so): the step whose commit removed it. ``None`` on a pruned link: not recorded as
    retired (deleted by hand, or its run's journal is gone)."""
    check: dict[str, Any] | None = None
    """On a resume link: the self-check of the steps that resume redid, as the run's later
    checkpoints signed it (``status``, ``compared``, ``identical``, ``first``)."""
    tier: str | None = None
    """On a resume link: ``local`` when the resume read a local-tier snapshot (RAM,
    :mod:`recovery.run.tiers.rules`); the link is then its persistent copy, the same digest (under
    ``torchrun``: the checkpoint promoted from it, ``promoted_from``)."""
    promoted_from: str | None = None
    """The digest the lineage recorded when it is not this checkpoint's own: the local
    snapshot (rank 0's) a ``torchrun`` job promoted it from, which a run that resumed from
    that snapshot links to."""
    error: str | None = None
    exception: RecoveryError | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "exception"}
        return d


@dataclass
class Report:
    """The audit of one artifact."""

    path: str
    links: list[Link]
    lineage: list[dict[str, Any]]
    abandoned: dict[str, str] | None = None
    """The target is a checkpoint of an abandoned branch (:func:`abandoned_of`)."""

    @property
    def ok(self) -> bool:
        return all(link.status != FAILED for link in self.links)

    @property
    def failures(self) -> list[Link]:
        return [link for link in self.links if link.status == FAILED]

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "links": [link.as_dict() for link in self.links],
            "lineage": self.lineage,
            "abandoned": self.abandoned,
            "certificate": certificate.resumes(self.lineage),
        }


def _describe(mf: Manifest, path: Path, relation: str) -> Link:
    rec = mf.recovery
    prov = rec.get("provenance", {})
    code = prov.get("code", {})
    signer = mf.signer
    return Link(
        relation=relation,
        name=mf.subject,
        step=mf.step,
        sha256=mf.root,
        status=OK,
        path=str(path),
        purpose=mf.purpose,
        run_id=rec.get("run_id"),
        signer=(
            {"key_id": signer.key_id, "trusted": signer.trusted, "dev": signer.dev or _dev(rec)}
            if signer
            else None
        ),
        code={"commit": code.get("commit"), "dirty": code.get("dirty"), "git": code.get("git")},
        dataset=prov.get("dataset", {}).get("version") or prov.get("dataset", {}).get("source"),
        dataset_stage=prov.get("dataset", {}).get("stage"),
        world_size=rec.get("world_size"),
        abandoned=abandoned_of(path),
        imported=_imported(prov),
        base=rec.get(chain.BASE),
    )


def _imported(prov: dict[str, Any]) -> dict[str, Any] | None:
    record = prov.get("imported")
    if not isinstance(record, dict):
        return None
    return {k: record.get(k) for k in ("kind", "source", "sha256", "origin")}


def _dev(rec: dict[str, Any]) -> bool:
    return bool((rec.get("signer") or {}).get("dev"))


def _flags(newer: dict[str, Any], older: dict[str, Any]) -> list[str]:
    """Which of code, dependencies, dataset, config changed between two provenance records."""
    flags = []
    if (newer.get("code", {}).get("commit"), newer.get("code", {}).get("diff_sha256")) != (
        older.get("code", {}).get("commit"),
        older.get("code", {}).get("diff_sha256"),
    ):
        flags.append("code")
    for name, key in (("dependencies", "sha256"), ("config", "sha256")):
        if newer.get(name, {}).get(key) != older.get(name, {}).get(key):
            flags.append(name)
    if newer.get("dataset", {}).get("version") != older.get("dataset", {}).get("version"):
        flags.append("dataset")
    return flags


def _next(rec: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The link to walk to from an artifact's statement, and the relation's name."""
    previous, parent = rec.get("previous"), rec.get("parent")
    if previous:
        same = parent and parent.get("sha256") == previous.get("sha256")
        return previous, str(parent.get("kind")) if same and parent else "previous"
    if parent:
        return parent, str(parent.get("kind"))
    return None, ""


def audit(
    path: Path, trust: TrustStore, *, allow_untrusted: bool = False, root: Path | None = None
) -> Report:
    """Verify ``path`` and every ancestor still on disk; describe the ones that are not.

    The target is verified before anything else is read; the root (``root``, by default
    :func:`default_root`, which for ``<run>/abandoned/<branch>/step-N`` is the directory
    above ``<run>``) is indexed only if there is a link to follow (:func:`index`). A target
    or link in a run's ``abandoned/<branch>/`` is marked so (:func:`abandoned_of`).

    Raises:
        CheckpointNotFoundError, ManifestError: ``path`` is no checkpoint at all (nothing
            there, a file, a run directory, a directory without ``model.sig``): there is
            no lineage to report. Any other damage, the target's included, is a ``failed``
            link in the report.
    """
    given = root
    root = root or default_root(path)
    moved = abandoned_of(path)
    links: list[Link] = []
    try:
        head = checked.check(path, trust, allow_untrusted=allow_untrusted)
    except RecoveryError as err:
        if not os.path.lexists(path / SIGNATURE_FILE):
            raise
        failed = Link("self", path.name, None, None, FAILED, str(path), abandoned=moved)
        failed.error, failed.exception = str(err), err
        links.append(failed)
        return Report(str(path), links, [], moved)
    if given is None:  # an exported artifact names the checkpoint root of its source
        root = recorded_root(head.manifest.recovery, path) or root
    known: Index | None = None
    segments: list[dict[str, Any]] = list(head.manifest.recovery.get("lineage", []))
    links.append(_describe(head.manifest, path, "self"))
    rec = head.manifest.recovery
    prov_newer: dict[str, Any] | None = rec.get("provenance", {})
    ref, relation = _next(rec)
    parent = rec.get("parent")
    seen = {head.manifest.root}
    while ref is not None:
        digest = str(ref.get("sha256"))
        if digest in seen:
            links.append(_from_ref(relation, ref, FAILED, error="lineage loops back on itself"))
            break
        seen.add(digest)
        seg = _segment(segments, ref)
        if known is None:  # only now: a target with no links never walks the root
            recorded = ref.get("path")  # the run it links into first (an export's: its run's)
            near = root / recorded if isinstance(recorded, str) and recorded else path
            known = index(root, first=run_dir_of(near))
        # an artifact not named step-N (an import) or outside the root: where it was recorded
        where = known.found.get(digest) or at_recorded(ref, root)
        if where is not None:
            try:
                loaded = checked.check(where, trust, allow_untrusted=allow_untrusted)
            except RecoveryError as err:
                why = {"error": str(err), "exception": err, "abandoned": abandoned_of(where)}
                links.append(_from_ref(relation, ref, FAILED, path=str(where), **why))
                ref, relation, prov_newer = _jump(segments, seg)
                continue
            link = _describe(loaded.manifest, where, relation)
            _promoted(link, loaded.manifest, digest, parent)
            prov_older = loaded.manifest.recovery.get("provenance", {})
            if prov_newer is not None and link.imported is None:  # no run to differ from
                link.drift = _flags(prov_newer, prov_older)
            links.append(link)
            prov_newer = prov_older
            ref, relation = _next(loaded.manifest.recovery)
            parent = loaded.manifest.recovery.get("parent")
        else:
            pruned = _from_ref(relation, ref, PRUNED, retired_at=_retired(ref, root, trust))
            if not known.complete and pruned.retired_at is None:
                log.warning(
                    "audit: %s (sha256 %s) is not in the index of %s, which is incomplete "
                    "(see above): shown as pruned, it may still be on disk",
                    ref.get("name"),
                    digest,
                    root,
                )
            links.append(pruned)
            ref, relation, prov_newer = _jump(segments, seg)
    for link in links:
        if link.relation in ("resume", "warm_start"):
            src_seg = _source_segment(segments, link.promoted_from or link.sha256)
            if src_seg and src_seg.get("drift"):
                link.drift = sorted({*link.drift, *(d.split(":", 1)[0] for d in src_seg["drift"])})
            if src_seg and src_seg.get("resharded"):
                link.resharded = src_seg["resharded"]
            if src_seg and isinstance(src_seg.get("check"), dict):
                link.check = src_seg["check"]
            if src_seg and (src_seg.get("from") or {}).get("tier") == "local":
                link.tier = "local"
    return Report(str(path), links, segments, moved)


def _promoted(link: Link, mf: Manifest, digest: str, parent: Any) -> None:
    """Mark a link that is a checkpoint promoted under ``torchrun`` from the local snapshot
    the lineage recorded (``digest``: found as :data:`~recovery.provenance.lineage.
    PROMOTED_FROM`), or from the snapshot the newer link's run resumed (its ``parent``:
    then the relation is that resume, as where both are one digest)."""
    source = mf.recovery.get(PROMOTED_FROM)
    was = source.get("sha256") if isinstance(source, dict) else None
    if isinstance(parent, dict) and was is not None and parent.get("sha256") == was:
        link.relation, link.promoted_from = str(parent.get("kind")), was
    elif mf.root != digest:
        link.promoted_from = digest


def _from_ref(relation: str, ref: dict[str, Any], status: str, **extra: Any) -> Link:
    """A link described only by what the newer artifact recorded about it."""
    fields: dict[str, Any] = {
        "path": str(ref.get("path")),
        "purpose": ref.get("purpose"),
        "run_id": ref.get("run_id"),
        **extra,
    }
    return Link(
        relation, str(ref.get("name")), ref.get("step"), str(ref.get("sha256")), status, **fields
    )


def recorded_root(rec: dict[str, Any], path: Path) -> Path | None:
    """The checkpoint root an exported artifact's statement records (``export.root``,
    relative to the artifact), when it is a directory; ``None`` otherwise (an older
    export, a checkpoint, or a root moved away: the caller keeps its default)."""
    relative = (rec.get("export") or {}).get("root")
    if not isinstance(relative, str) or not relative or os.path.isabs(relative):
        return None
    where = Path(os.path.normpath(Path(os.path.abspath(path)) / relative))
    return where if where.is_dir() else None


def _retired(ref: dict[str, Any], root: Path, trust: TrustStore) -> int | None:
    """The step whose commit made retention delete the checkpoint ``ref`` records, read
    from the sealed journal of the run it was recorded in; ``None``: not recorded so."""
    recorded, step = ref.get("path"), ref.get("step")
    if not isinstance(recorded, str) or not recorded or not isinstance(step, int):
        return None
    run_dir = run_dir_of(Path(recorded) if os.path.isabs(recorded) else root / recorded)
    return retired_at(run_dir, trust).get(step)


def _segment(segments: list[dict[str, Any]], ref: dict[str, Any]) -> dict[str, Any] | None:
    idx = ref.get("segment")
    return segments[idx] if isinstance(idx, int) and 0 <= idx < len(segments) else None


def _jump(
    segments: list[dict[str, Any]], seg: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, str, None]:
    """From a link that cannot be followed, go to the source of the segment it belongs to."""
    if seg is None or not seg.get("from"):
        return None, "", None
    return seg["from"], str(seg.get("kind")), None


def _source_segment(segments: list[dict[str, Any]], digest: str | None) -> dict[str, Any] | None:
    for seg in segments:
        if (seg.get("from") or {}).get("sha256") == digest:
            return seg
    return None
