"""The run's best checkpoint: an independent copy under ``<run>/best/``, and what an
interrupted copy left there. Run after a commit (:func:`keep_best`, from
:func:`recovery.run.saving.retention.after_commit`) and at a writer's start
(:func:`tidy_best`)."""

from __future__ import annotations

import logging
from pathlib import Path

from recovery import faults
from recovery.errors import RecoveryError
from recovery.format.layout import BEST_DIR, parse_step, scan, temp_dir_for
from recovery.format.manifest import Manifest
from recovery.integrity import nofollow
from recovery.integrity.commits import commit
from recovery.integrity.commits.reaping import Reaper
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import chain, reader
from recovery.run import policy

log = logging.getLogger(__name__)

INCOMING = ".incoming-"
"""``<run>/best/.incoming-<delta>``: names the base a best copy of that delta brought in,
until the delta is in place (:func:`keep_best`, :func:`tidy_best`)."""


def tidy_best(run_dir: Path) -> list[Path]:
    """At a writer's start: remove what an interrupted best copy left under ``<run>/best``
    (its temp directory, and a superseded best the kill did not let it delete).

    Returns:
        What was removed.
    """
    best_dir = run_dir / BEST_DIR
    nofollow.refuse_link(best_dir, "the run's best-checkpoint directory")
    if not best_dir.is_dir():
        return []
    removed = commit.remove_stale(best_dir)
    for mark in sorted(best_dir.glob(INCOMING + "*")):
        nofollow.refuse_link(mark, "a best copy's mark file")
        # a delta's copy was cut short after its chain was brought in: those links are no
        # best. The mark names them; only checkpoint names of best/ itself are taken from
        # it (the file is in the run directory: anyone who can write there could write a path)
        for named in mark.read_text(errors="replace").split():
            brought = best_dir / named
            if parse_step(named) is None:
                log.warning(
                    "ignoring %s: it names %r, not a checkpoint of %s", mark, named, best_dir
                )
            elif not (best_dir / mark.name[len(INCOMING) :]).is_dir():
                log.warning("removing %s: brought for a best copy never committed", brought)
                commit.discard(brought)
                removed.append(brought)
        mark.unlink()
        commit.fsync_dir(best_dir)
    kept = scan(best_dir).committed
    needed = _chain_names(kept[-1][1]) if kept else []
    for _, old in kept[:-1]:
        if old.name in needed:
            continue  # the chain below the best (a delta)
        log.warning("removing %s: a best checkpoint superseded by a newer one", old)
        commit.discard(old)
        removed.append(old)
    return removed


def _manifest(path: Path) -> Manifest:
    return reader.read_manifest(path, TrustStore(), allow_untrusted=True)


def _chain_names(path: Path) -> list[str]:
    """The directory names of the chain a checkpoint needs (empty: full, or unreadable)."""
    try:
        return [b.name for b in chain.named(path, _manifest(path), _manifest)]
    except RecoveryError:
        return []


def keep_best(
    run_dir: Path,
    final: Path,
    mf: Manifest,
    *,
    metric: str,
    mode: str,
    trust: TrustStore,
    allow_untrusted: bool,
    reaper: Reaper | None = None,
) -> bool:
    """Copy ``final`` to ``<run>/best/`` if its ``metric`` beats the kept best (atomically).

    The copy is independent (new files, not links; subdirectories of a
    distributed checkpoint included), so nothing that later happens to the
    run's checkpoints can alter it. A kept best that no longer verifies is
    replaced. Returns whether ``final`` became the best.
    """
    value = mf.recovery.get("metrics", {}).get(metric)
    if not isinstance(value, int | float):
        return False
    best_dir = run_dir / BEST_DIR
    # a best/ planted as a symlink would take an independent copy of the run outside it
    nofollow.refuse_link(best_dir, "the run's best-checkpoint directory")
    current = [p for _, p in scan(best_dir).committed] if best_dir.is_dir() else []
    best_value = None
    if current:  # the newest committed one is the best (see tidy_best)
        try:
            kept = reader.read_manifest(current[-1], trust, allow_untrusted=allow_untrusted)
            best_value = kept.recovery.get("metrics", {}).get(metric)
        except RecoveryError as err:
            log.warning("best checkpoint %s does not verify (%s); replacing it", current[-1], err)
    if not policy.is_better(float(value), best_value, mode=mode):
        return False
    best_dir.mkdir(exist_ok=True)
    links = chain.named(final, mf, _manifest)
    mark = best_dir / f"{INCOMING}{final.name}"
    brought = [b for b in links if not _holds(best_dir / b.name, b.digest, trust)]
    taken = [b.name for b in brought if _holds_other(best_dir / b.name, b.digest, trust)]
    if taken:
        # a branch wrote these steps again: bringing this chain would replace links the
        # kept best may stand on, one by one, and a kill between would leave neither
        log.warning(
            "%s is not copied as the best: its chain's %s differ from the copies under %s "
            "(a branch wrote those steps again); the kept best stays until a checkpoint "
            "whose chain does not collide beats it",
            final.name,
            ", ".join(taken),
            best_dir,
        )
        return False
    if brought:
        # a delta's copy needs its chain beside it: brought first, marked as brought for
        # this delta, so a kill before the delta is in place leaves the mark, and
        # tidy_best removes those links instead of taking one for the newest best
        commit.write_file(mark, "\n".join(b.name for b in brought).encode())
        commit.fsync_dir(best_dir)
        for b in reversed(brought):
            _copy(final.parent / b.name, best_dir, reaper=reaper)
    _copy(final, best_dir, fault=f"best-copy-{mf.step}", reaper=reaper)
    if mark.exists():
        mark.unlink()
    faults.reach(f"best-swap-{mf.step}")  # both committed, the old not yet removed
    keep = {final.name, *(b.name for b in links)}
    for old in current:
        if old.name not in keep:
            commit.discard(old, reaper=reaper)
    commit.fsync_dir(best_dir)
    log.info("best checkpoint: %s (%s %s %.6g)", final.name, metric, mode, float(value))
    return True


def _holds(path: Path, digest: str, trust: TrustStore) -> bool:
    """Whether ``path`` is a committed checkpoint with subject digest ``digest`` whose every
    file verifies."""
    if not path.is_dir():
        return False
    try:
        return reader.read_verified(path, trust, allow_untrusted=True).manifest.root == digest
    except RecoveryError:
        return False


def _holds_other(path: Path, digest: str, trust: TrustStore) -> bool:
    """Whether ``path`` is a committed checkpoint whose every file verifies, of another
    subject digest than ``digest`` (a damaged one may be replaced)."""
    if not path.is_dir():
        return False
    try:
        return reader.read_verified(path, trust, allow_untrusted=True).manifest.root != digest
    except RecoveryError:
        return False


def _copy(
    source: Path, into: Path, *, fault: str | None = None, reaper: Reaper | None = None
) -> None:
    """Copy the committed ``source`` into the directory ``into`` atomically: independent
    files (not links, subdirectories included), fsynced, then renamed into place. A
    kill after ``fault`` (the copy complete, not yet committed) leaves a temp directory."""
    tmp = temp_dir_for(into / source.name)
    # every file created through a descriptor of its directory, new and 0644 (committed
    # files are read-only; the copy must be deletable later): a name swapped for a link
    # while the copy runs takes no write elsewhere
    nofollow.copy_tree(source, into, tmp.name)
    if fault:
        faults.reach(fault)
    # published before the old best goes: a kill in between leaves two committed, and
    # the newer (better, or it would not have been copied) is the one readers take. One
    # of that name (another branch's) goes only once the copy is complete
    commit.discard(into / source.name, reaper=reaper)
    nofollow.rename(into.parent, tmp, into / source.name)
