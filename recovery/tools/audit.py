"""Audit: verify an artifact and walk its lineage back to the start of the run that made it.

The walk follows each artifact's ``previous`` link; an artifact that is still
on disk is verified in full (signature, trust, hashes, purpose contract) and
the walk continues from its own links. Checkpoints deleted by retention are
shown as ``pruned`` with the digest recorded for them, and the walk jumps to
the start of the run segment they belonged to (the checkpoint that segment
resumed or was warm-started from), using the ``lineage`` list every artifact
carries. It ends at the segment that started fresh.

Artifacts are found by digest, not by name, under the checkpoint root (by
default the directory above the artifact's run directory), so a renamed or
replaced directory is never mistaken for the one that was recorded. The target
is verified first; the root is indexed only when there is a link to follow, and
that walk is bounded (:data:`MAX_DEPTH`, :data:`MAX_DIRS`), stays under the root
(links are never followed) and skips, with a one-line warning each, whatever
it cannot read, so one bad entry elsewhere cannot sink the audit.
"""

from __future__ import annotations

import base64
import logging
import os
import stat
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.errors import RecoveryError
from recovery.format import bounded
from recovery.format.layout import BEST_DIR, SIGNATURE_FILE, is_uncommitted, parse_step
from recovery.format.manifest import Manifest
from recovery.integrity.signing import MAX_BUNDLE_BYTES, TrustStore
from recovery.run import resume
from recovery.run.checkpointer import WARM_START_DIR

log = logging.getLogger(__name__)

OK = "ok"
PRUNED = "pruned"
FAILED = "failed"
MAX_DEPTH = 3
"""Levels below the root the index lists: ``<run>/``, ``<run>/best|warm_start/``, and one
more (a run name with a slash, a run's ``abandoned/<branch>/``)."""
MAX_DIRS = 10_000
"""Most directories the index examines (each one it lists or checks as a checkpoint) before
it stops with a warning. Hundreds of runs with their kept checkpoints fit; a root that is
none (``/``, ``$HOME``) ends in seconds instead of minutes."""
MAX_WARNINGS = 20
"""Skipped entries warned about one line each; the rest are counted in one summary line."""


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
    world_size: int | None = None
    """How many ranks wrote it (``torchrun``); 1 for a single process."""
    resharded: dict[str, Any] | None = None
    """On a resume link: the world size changed there (``from``, ``to``)."""
    drift: list[str] = field(default_factory=list)
    """What changed between this link and the newer one above it (code, dependencies, ...)."""
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
        }


def default_root(path: Path) -> Path:
    """The checkpoint root an artifact's links are relative to: the directory above its run
    directory (:func:`run_dir_of`)."""
    return run_dir_of(path).parent


def run_dir_of(path: Path) -> Path:
    """The run directory of ``<run>/step-N``, ``<run>/best/step-N``, ``<run>/warm_start/step-N``.

    Taken from the absolute path (not resolved: a linked run directory stays where it is
    named), so a relative ``step-N`` given inside its run directory still has the runs
    beside it under its root.
    """
    path = Path(os.path.abspath(path))
    return path.parent.parent if path.parent.name in (WARM_START_DIR, BEST_DIR) else path.parent


@dataclass
class Index:
    """The signed step directories :func:`index` found under a root."""

    found: dict[str, Path]
    """Root digest each ``model.sig`` claims -> its directory (not yet verified)."""
    complete: bool = True
    """False when something was skipped or :data:`MAX_DIRS` stopped the walk: a digest not
    in ``found`` may still be on disk."""


def index(root: Path, *, first: Path | None = None) -> Index:
    """Every signed step directory under ``root``, breadth first, the directory ``first``
    (the target's run) before the rest, so the cap never costs the target its own run.

    At most :data:`MAX_DEPTH` levels and :data:`MAX_DIRS` directories; no symlink is
    followed, so nothing outside ``root`` is read. A directory that cannot be listed, a
    step-named entry that is not a directory, a missing, oversized or malformed
    ``model.sig``, a link to a directory: each is skipped with a one-line warning. Reads only
    each ``model.sig``'s statement to learn its digest; nothing is trusted here, every link
    that is used is verified in full afterwards. Never raises.
    """
    idx, skipped, examined = Index({}), 0, 0

    def skip(path: Path, why: str) -> None:
        nonlocal skipped
        skipped += 1
        idx.complete = False
        (log.warning if skipped <= MAX_WARNINGS else log.debug)("audit: skipped %s: %s", path, why)

    queue: deque[tuple[Path, int]] = deque([(root, 0)])
    below = _depth(first, root) if first is not None else None
    if first is not None and below is not None:
        queue.appendleft((first, below))
    listed: set[str] = set()
    while queue and examined <= MAX_DIRS:
        current, depth = queue.popleft()
        if os.path.abspath(current) in listed:
            continue
        listed.add(os.path.abspath(current))
        try:
            with os.scandir(current) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as err:
            skip(current, f"cannot list it ({err.strerror or err})")
            continue
        for entry in entries:
            path, step = Path(entry.path), parse_step(entry.name)
            try:
                if entry.is_symlink():
                    if step is not None or _links_to_dir(entry):
                        skip(path, f"a symlink, not followed (the index stays under {root})")
                    continue
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError as err:
                skip(path, f"cannot stat it ({err.strerror or err})")
                continue
            if not is_dir or is_uncommitted(entry.name):
                if step is not None and not is_dir:
                    skip(path, "named like a checkpoint but not a directory")
                continue
            examined += 1
            if examined > MAX_DIRS:
                idx.complete = False
                log.warning(
                    "audit: stopped indexing %s after %d directories (MAX_DIRS); ancestors "
                    "not reached show as pruned. Pass --root <the checkpoint root>",
                    root,
                    MAX_DIRS,
                )
                break
            if step is None:
                if depth < MAX_DEPTH:
                    queue.append((path, depth + 1))
                continue
            digest, why = _claimed_digest(path / SIGNATURE_FILE)
            if digest is None:
                skip(path, why)
            else:
                idx.found.setdefault(digest, path)
    if skipped > MAX_WARNINGS:
        log.warning("audit: skipped %d more entries under %s", skipped - MAX_WARNINGS, root)
    return idx


def _links_to_dir(entry: os.DirEntry[str]) -> bool:
    """Whether a symlink points at a directory (or loops: it cannot be told)."""
    try:
        return entry.is_dir()
    except OSError:
        return True


def _depth(path: Path, root: Path) -> int | None:
    """How many levels ``path`` lies below ``root`` (None: not under it)."""
    try:
        return len(Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).parts)
    except ValueError:
        return None


def _claimed_digest(sig: Path) -> tuple[str | None, str]:
    """The root digest ``sig`` claims, or None and why it cannot be read.

    Reads a regular file only (a FIFO would block) and at most ``MAX_BUNDLE_BYTES``.
    """
    try:
        st = os.lstat(sig)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{SIGNATURE_FILE} is not a regular file"
        if st.st_size > MAX_BUNDLE_BYTES:
            return None, f"{SIGNATURE_FILE} holds {st.st_size} bytes, over {MAX_BUNDLE_BYTES}"
        fd = os.open(sig, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_BUNDLE_BYTES + 1)
    except FileNotFoundError:
        return None, f"no {SIGNATURE_FILE}: a checkpoint that was never committed"
    except OSError as err:
        return None, f"cannot read {SIGNATURE_FILE} ({err.strerror or err})"
    try:
        bundle = bounded.json_loads(data, limit=MAX_BUNDLE_BYTES)
        statement = bounded.json_loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        return str(statement["subject"][0]["digest"]["sha256"]), ""
    except (ValueError, KeyError, TypeError, IndexError) as err:
        return None, f"malformed {SIGNATURE_FILE} ({type(err).__name__}: {err})"


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
        world_size=rec.get("world_size"),
    )


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
    :func:`default_root`) is indexed only if there is a link to follow (:func:`index`).

    Raises:
        CheckpointNotFoundError, ManifestError: ``path`` is no checkpoint at all (nothing
            there, a file, a run directory, a directory without ``model.sig``): there is
            no lineage to report. Any other damage, the target's included, is a ``failed``
            link in the report.
    """
    root = root or default_root(path)
    links: list[Link] = []
    try:
        head = resume.load(path, trust, allow_untrusted=allow_untrusted)
    except RecoveryError as err:
        if not os.path.lexists(path / SIGNATURE_FILE):
            raise
        links.append(
            Link("self", path.name, None, None, FAILED, str(path), error=str(err), exception=err)
        )
        return Report(str(path), links, [])
    known: Index | None = None
    segments: list[dict[str, Any]] = list(head.manifest.recovery.get("lineage", []))
    links.append(_describe(head.manifest, path, "self"))
    rec = head.manifest.recovery
    prov_newer: dict[str, Any] | None = rec.get("provenance", {})
    ref, relation = _next(rec)
    seen = {head.manifest.root}
    while ref is not None:
        digest = str(ref.get("sha256"))
        if digest in seen:
            links.append(_from_ref(relation, ref, FAILED, error="lineage loops back on itself"))
            break
        seen.add(digest)
        seg = _segment(segments, ref)
        if known is None:  # only now: a target with no links never walks the root
            known = index(root, first=run_dir_of(path))
        where = known.found.get(digest)
        if where is not None:
            try:
                loaded = resume.load(where, trust, allow_untrusted=allow_untrusted)
            except RecoveryError as err:
                links.append(
                    _from_ref(relation, ref, FAILED, path=str(where), error=str(err), exception=err)
                )
                ref, relation, prov_newer = _jump(segments, seg)
                continue
            link = _describe(loaded.manifest, where, relation)
            prov_older = loaded.manifest.recovery.get("provenance", {})
            if prov_newer is not None:
                link.drift = _flags(prov_newer, prov_older)
            links.append(link)
            prov_newer = prov_older
            ref, relation = _next(loaded.manifest.recovery)
        else:
            if not known.complete:
                log.warning(
                    "audit: %s (sha256 %s) is not in the index of %s, which is incomplete "
                    "(see above): shown as pruned, it may still be on disk",
                    ref.get("name"),
                    digest,
                    root,
                )
            links.append(_from_ref(relation, ref, PRUNED))
            ref, relation, prov_newer = _jump(segments, seg)
    for link in links:
        if link.relation in ("resume", "warm_start"):
            src_seg = _source_segment(segments, link.sha256)
            if src_seg and src_seg.get("drift"):
                link.drift = sorted({*link.drift, *(d.split(":", 1)[0] for d in src_seg["drift"])})
            if src_seg and src_seg.get("resharded"):
                link.resharded = src_seg["resharded"]
    return Report(str(path), links, segments)


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
