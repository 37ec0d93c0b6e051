"""The audit's root index: where in a checkpoint root each recorded digest lies on disk.

An audit follows links by the digest they record, never by the path: a renamed,
replaced or moved directory (a checkpoint of an abandoned branch, moved from
``<run>/step-N`` to ``<run>/abandoned/<branch>/step-N``) is found where it is now, and
a new checkpoint written under an old name is never mistaken for the recorded one.

:func:`index` lists every signed step directory under a root and learns the digest
each ``model.sig`` claims; nothing is trusted here, the audit verifies in full every
directory it uses. The walk is bounded (:data:`MAX_DEPTH` levels, a run's
``abandoned/<branch>/`` not counted; :data:`MAX_DIRS` directories), stays under the
root (no symlink is followed), never raises, and skips with a one-line warning each
whatever it cannot read. It never enters what holds no checkpoints: hidden directories
(``.git``, ``.venv``, ``.dvc``, ``.hydra``), virtualenvs (a ``pyvenv.cfg``),
``node_modules``, ``site-packages``, ``__pycache__``: an artifact's root is often the
project itself. :func:`default_root`, :func:`run_dir_of` and :func:`abandoned_of` tell
from a checkpoint's path which root and run it belongs to; :func:`retired_at`, from its
run's sealed journal, which steps retention deleted.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import stat
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from recovery.format import bounded
from recovery.format.layout import (
    ABANDONED_DIR,
    BEST_DIR,
    METRICS_FILE,
    SIGNATURE_FILE,
    WARM_START_DIR,
    is_uncommitted,
    parse_step,
)
from recovery.integrity.keys.signing import MAX_BUNDLE_BYTES, TrustStore
from recovery.provenance.lineage import PROMOTED_FROM
from recovery.run import journal

log = logging.getLogger(__name__)

MAX_DEPTH = 3
"""Levels below the root the index lists: ``<run>/``, ``<run>/best|warm_start/``, and one
more (a run name with a slash). A run's ``abandoned/<branch>/`` adds none: its moved
checkpoints are listed wherever the run is."""
MAX_DIRS = 10_000
"""Most directories the index examines (each one it lists or checks as a checkpoint) before
it stops with a warning. Hundreds of runs with their kept checkpoints fit; a root that is
none (``/``, ``$HOME``) ends in seconds instead of minutes."""
NOT_CHECKPOINTS = frozenset({"node_modules", "site-packages", "__pycache__"})
"""Directory names the index never enters (nor any hidden one, nor a virtualenv)."""
MAX_WARNINGS = 20
"""Skipped entries warned about one line each; the rest are counted in one summary line."""

_BRANCH = re.compile(r"^from-\d{8,}-\d{8}T\d{6}$")
"""The name :func:`recovery.run.restoring.branches.branch_name` gives a branch's directory."""

# where a directory lies relative to a run's abandoned/ (such levels cost no depth)
_OUTSIDE, _IN_ABANDONED, _IN_BRANCH = 0, 1, 2


def default_root(path: Path) -> Path:
    """The checkpoint root an artifact's links are relative to: the directory above its run
    directory (:func:`run_dir_of`)."""
    return run_dir_of(path).parent


def run_dir_of(path: Path) -> Path:
    """The run directory of ``<run>/step-N``, ``<run>/best/step-N``,
    ``<run>/warm_start/step-N`` and ``<run>/abandoned/<branch>/step-N``.

    Taken from the absolute path (not resolved: a linked run directory stays where it is
    named), so a relative ``step-N`` given inside its run directory still has the runs
    beside it under its root.
    """
    path = Path(os.path.abspath(path))
    moved = abandoned_of(path)
    if moved is not None:
        return Path(moved["run_dir"])
    return path.parent.parent if path.parent.name in (WARM_START_DIR, BEST_DIR) else path.parent


def abandoned_of(path: Path) -> dict[str, str] | None:
    """``{"branch": ..., "run_dir": ...}`` when ``path`` is ``<run>/abandoned/<branch>/step-N``
    (``<branch>`` named as :mod:`recovery.run.restoring.branches` names it), the checkpoint
    moved out of ``<run>`` when the run resumed from an earlier step; ``None`` for any other path.

    Read from the (absolute, unresolved) path alone: it says where the checkpoint lies,
    not what it holds, which only verification tells.
    """
    path = Path(os.path.abspath(path))
    branch = path.parent
    if branch.parent.name != ABANDONED_DIR or not _BRANCH.match(branch.name):
        return None
    return {"branch": branch.name, "run_dir": str(branch.parent.parent)}


@dataclass
class Index:
    """The signed step directories :func:`index` found under a root."""

    found: dict[str, Path]
    """Root digest each ``model.sig`` claims -> its directory (not yet verified); also the
    digest of the local snapshot a checkpoint says it was promoted from (:func:`_claims`)."""
    complete: bool = True
    """False when something was skipped or :data:`MAX_DIRS` stopped the walk: a digest not
    in ``found`` may still be on disk."""


def index(root: Path, *, first: Path | None = None) -> Index:
    """Every signed step directory under ``root``, breadth first, the directory ``first``
    (the target's run) before the rest, so the cap never costs the target its own run.

    At most :data:`MAX_DEPTH` levels (a run's ``abandoned/`` and the branch directories in
    it not counted) and :data:`MAX_DIRS` directories; no symlink is followed, so nothing
    outside ``root`` is read. A directory that cannot be listed, a step-named entry that is
    not a directory, a missing, oversized or malformed ``model.sig``, a link to a directory:
    each is skipped with a one-line warning. Reads only each ``model.sig``'s statement to
    learn its digest; nothing is trusted here, every link that is used is verified in full
    afterwards. When two directories claim one digest, the first found is kept. Never
    raises.
    """
    idx, skipped, examined = Index({}), 0, 0

    def skip(path: Path, why: str) -> None:
        nonlocal skipped
        skipped += 1
        idx.complete = False
        (log.warning if skipped <= MAX_WARNINGS else log.debug)("audit: skipped %s: %s", path, why)

    queue: deque[tuple[Path, int, int]] = deque([(root, 0, _OUTSIDE)])
    below = _depth(first, root) if first is not None else None
    if first is not None and below is not None:
        queue.appendleft((first, below, _OUTSIDE))
    listed: set[str] = set()
    while queue and examined <= MAX_DIRS:
        current, depth, where = queue.popleft()
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
                if _holds_none(path):
                    continue
                below_it = _below(entry.name, depth, where)
                if below_it is not None:
                    queue.append((path, *below_it))
                continue
            claims, why = _claims(path / SIGNATURE_FILE)
            if not claims:
                skip(path, why)
            for digest in claims:
                idx.found.setdefault(digest, path)
    if skipped > MAX_WARNINGS:
        log.warning("audit: skipped %d more entries under %s", skipped - MAX_WARNINGS, root)
    return idx


def _holds_none(path: Path) -> bool:
    """Whether a directory is one that holds no checkpoints (:data:`NOT_CHECKPOINTS`, a
    hidden one, a virtualenv), never indexed: listing ``.venv`` costs seconds and warns
    about every link inside it."""
    return (
        path.name.startswith(".")
        or path.name in NOT_CHECKPOINTS
        or os.path.lexists(path / "pyvenv.cfg")
    )


def retired_at(run_dir: Path, trust: TrustStore) -> dict[int, int]:
    """Step -> the step whose commit made retention delete it, as the run's journal
    (``<run>/metrics.jsonl``) records it in ``retired`` events sealed by a trusted key
    (:mod:`recovery.integrity.keys.seal`); a step written again later is not retired. Empty
    when there is no journal or it cannot be read."""
    path = run_dir / METRICS_FILE
    try:
        obeyed = journal.sealed_chain(path, trust).obeyed if path.is_file() else []
    except (OSError, ValueError):
        return {}
    out: dict[int, int] = {}
    pending: list[int] = []
    last = 0
    for rec in obeyed:
        step = rec.get("step")
        if rec.get("event") == "checkpoint" and isinstance(step, int):
            out.pop(step, None)  # written again (a branch): on disk, not retired
            out.update(dict.fromkeys(pending, step))  # a commit retires before it is logged
            pending, last = [], step
        elif rec.get("event") == "retired":
            pending += [s for s in rec.get("steps", []) if isinstance(s, int)]
    out.update(dict.fromkeys(pending, last))
    return out


def _below(name: str, depth: int, where: int) -> tuple[int, int] | None:
    """The depth and place of a directory ``name`` found in one at ``depth``, ``where``;
    ``None``: not listed. A run's ``abandoned/`` and each branch in it keep their parent's
    depth; a branch holds only step directories, so nothing below one is listed."""
    if where == _OUTSIDE and name == ABANDONED_DIR:
        return depth, _IN_ABANDONED
    if where == _IN_ABANDONED:
        return depth, _IN_BRANCH
    if where == _OUTSIDE and depth < MAX_DEPTH:
        return depth + 1, _OUTSIDE
    return None


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


def at_recorded(ref: dict[str, object], root: Path) -> Path | None:
    """The directory a link records (its ``path``: relative to ``root``, or absolute) when
    its ``model.sig`` claims the link's digest; ``None`` otherwise. For an artifact the
    index does not list: one not named ``step-N`` (an imported artifact under any name),
    or one outside the root; a step directory under the root is the index's alone.
    Nothing is trusted here: the audit verifies it in full."""
    recorded, digest = ref.get("path"), ref.get("sha256")
    if not isinstance(recorded, str) or not recorded or not isinstance(digest, str):
        return None
    path = Path(recorded) if os.path.isabs(recorded) else root / recorded
    if parse_step(path.name) is not None and _depth(path, root) is not None:
        return None  # the index's to find: not there means moved, replaced or deleted
    claimed, _ = _claimed_digest(path / SIGNATURE_FILE)
    return path if claimed == digest else None


def _claimed_digest(sig: Path) -> tuple[str | None, str]:
    """The root digest ``sig`` claims, or None and why it cannot be read."""
    claims, why = _claims(sig)
    return (claims[0] if claims else None), why


def _claims(sig: Path) -> tuple[list[str], str]:
    """The digests a directory answers for: the root digest ``sig`` claims and, when it
    says it was promoted from a local snapshot of another digest (under ``torchrun``:
    :data:`~recovery.provenance.lineage.PROMOTED_FROM`), that snapshot's, which a lineage
    may record; ``[]`` and why ``sig`` cannot be read.

    Reads a regular file only (a FIFO would block) and at most ``MAX_BUNDLE_BYTES``.
    """
    try:
        st = os.lstat(sig)
        if not stat.S_ISREG(st.st_mode):
            return [], f"{SIGNATURE_FILE} is not a regular file"
        if st.st_size > MAX_BUNDLE_BYTES:
            return [], f"{SIGNATURE_FILE} holds {st.st_size} bytes, over {MAX_BUNDLE_BYTES}"
        fd = os.open(sig, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_BUNDLE_BYTES + 1)
    except FileNotFoundError:
        return [], f"no {SIGNATURE_FILE}: a checkpoint that was never committed"
    except OSError as err:
        return [], f"cannot read {SIGNATURE_FILE} ({err.strerror or err})"
    try:
        bundle = bounded.json_loads(data, limit=MAX_BUNDLE_BYTES)
        statement = bounded.json_loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        claims = [str(statement["subject"][0]["digest"]["sha256"])]
    except (ValueError, KeyError, TypeError, IndexError) as err:
        return [], f"malformed {SIGNATURE_FILE} ({type(err).__name__}: {err})"
    recovery = (statement.get("predicate") or {}).get("recovery")
    source = recovery.get(PROMOTED_FROM) if isinstance(recovery, dict) else None
    if isinstance(source, dict) and isinstance(source.get("sha256"), str):
        claims.append(source["sha256"])
    return claims, ""
