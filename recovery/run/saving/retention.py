"""What a run keeps: its newest checkpoints and milestones, and an independent copy of its best.

Both run after a new checkpoint is committed, on the committing process only
(rank 0 of a ``torchrun`` job). The decisions are :mod:`recovery.run.policy`'s
pure functions; this module applies them to the directory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recovery import faults
from recovery.config import CheckpointConfig
from recovery.errors import ConfigError, RecoveryError
from recovery.format.layout import BEST_DIR, parse_step, scan, temp_dir_for
from recovery.format.manifest import Manifest
from recovery.integrity import nofollow
from recovery.integrity.commits import commit
from recovery.integrity.commits.reaping import Reaper
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import chain, reader
from recovery.run import policy
from recovery.run.tiers import rules

log = logging.getLogger(__name__)

INCOMING = ".incoming-"
"""``<run>/best/.incoming-<delta>``: names the base a best copy of that delta brought in,
until the delta is in place (:func:`keep_best`, :func:`tidy_best`)."""


def after_commit(
    cfg: CheckpointConfig,
    run_dir: Path,
    final: Path,
    mf: Manifest,
    *,
    trust: TrustStore,
    allow_untrusted: bool,
    retire: Callable[[Path], None] | None,
    reaper: Reaper | None = None,
) -> list[int]:
    """What the settings ask once ``final`` is committed: the best copy, then retention
    (the deleted directories' files removed on ``reaper``'s thread, when given).

    Returns:
        The steps retention deleted (the run's journal records them).
    """
    if cfg.keep_best and cfg.best_metric is not None:
        keep_best(
            run_dir,
            final,
            mf,
            metric=cfg.best_metric,
            mode=cfg.best_mode,
            trust=trust,
            allow_untrusted=allow_untrusted,
            reaper=reaper,
        )
    doomed = retain(
        run_dir,
        mf.step,
        keep_last=cfg.keep_last,
        keep_every=cfg.keep_every,
        retire=retire,
        reaper=reaper,
        trust=trust,
    )
    return [s for s in (parse_step(p.name) for p in doomed) if s is not None]


def check_metric(cfg: CheckpointConfig, metrics: dict[str, Any] | None) -> None:
    """With ``keep_best``, the metric that ranks checkpoints must be among those recorded.

    Raises:
        ConfigError: ``best_metric`` is unset or not a number this run records.
    """
    if not cfg.keep_best:
        return
    have = sorted(k for k, v in (metrics or {}).items() if isinstance(v, int | float))
    if cfg.best_metric not in have:
        raise ConfigError(
            f"checkpoint.best_metric={cfg.best_metric}: not a metric this run records "
            f"(it records {', '.join(have) or 'none'}); set checkpoint.best_metric= one of "
            "them, or checkpoint.keep_best=false"
        )


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


def _tier(path: Path) -> str | None:
    """The tier a checkpoint's statement names (read, not verified: a forged ``local`` only
    keeps a checkpoint from being counted or deleted)."""
    try:
        mf = reader.read_manifest(path, TrustStore(), allow_untrusted=True)
    except RecoveryError:
        return None
    tier = mf.recovery.get("tier")
    return tier if isinstance(tier, str) else None


def _manifest(path: Path) -> Manifest:
    return reader.read_manifest(path, TrustStore(), allow_untrusted=True)


def _chain_names(path: Path) -> list[str]:
    """The directory names of the chain a checkpoint needs (empty: full, or unreadable)."""
    try:
        return [b.name for b in chain.named(path, _manifest(path), _manifest)]
    except RecoveryError:
        return []


def retain(
    run_dir: Path,
    newest: int,
    *,
    keep_last: int,
    keep_every: int,
    retire: Callable[[Path], None] | None = None,
    reaper: Reaper | None = None,
    trust: TrustStore | None = None,
) -> list[Path]:
    """Delete the committed checkpoints the policy no longer keeps; return them.

    ``retire`` (the DVC publisher's) removes a checkpoint in order with its
    registration; without it the directory is renamed away at once and its
    files deleted here, or on ``reaper``'s thread. With ``trust``, each
    checkpoint's signed statement is read for the base it needs (a delta's base is
    kept while the delta is: :func:`~recovery.run.policy.to_delete`).
    """
    paths = dict(scan(run_dir).committed)
    if trust is not None:  # a local snapshot put here counts for nothing, nor is deleted
        for step, path in list(paths.items()):
            if _tier(path) == rules.LOCAL:
                log.warning("retention: passing over %s", rules.not_durable(path))
                del paths[step]
    doomed = policy.to_delete(
        paths,
        newest=newest,
        keep_last=keep_last,
        keep_every=keep_every,
        bases=bases_of(paths, trust) if trust is not None else None,
    )
    for step in doomed:
        log.info("retention: removing %s", paths[step])
        if retire is None:
            commit.discard(paths[step], fault_point=f"retire-{step}", reaper=reaper)
        else:
            retire(paths[step])
    return [paths[step] for step in doomed]


def bases_of(paths: dict[int, Path], trust: TrustStore) -> dict[int, int]:
    """Each delta's base step, from its signed statement (only the signature is read).

    A checkpoint whose statement does not verify names no base: it cannot serve a
    resume, so it protects nothing.
    """
    out = {}
    for step, path in paths.items():
        try:
            base = chain.base_of(reader.read_manifest(path, trust, allow_untrusted=True), path)
        except RecoveryError:
            continue
        if base is not None:
            out[step] = base.step
    return out


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
