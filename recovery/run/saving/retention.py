"""What a run keeps: its newest checkpoints and milestones, and an independent copy of its
best (:mod:`recovery.run.saving.best`).

Both run after a new checkpoint is committed, on the committing process only
(rank 0 of a ``torchrun`` job). The decisions are :mod:`recovery.run.policy`'s
pure functions; this module applies them to the directory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recovery.config import CheckpointConfig
from recovery.errors import ConfigError, RecoveryError
from recovery.format.layout import parse_step, scan
from recovery.format.manifest import Manifest
from recovery.integrity.commits import commit
from recovery.integrity.commits.reaping import Reaper
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import chain, reader
from recovery.run import policy
from recovery.run.saving.best import INCOMING as INCOMING  # the best copy's
from recovery.run.saving.best import keep_best
from recovery.run.saving.best import tidy_best as tidy_best  # the run's start tidies
from recovery.run.tiers import rules

log = logging.getLogger(__name__)


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


def _tier(path: Path) -> str | None:
    """The tier a checkpoint's statement names (read, not verified: a forged ``local`` only
    keeps a checkpoint from being counted or deleted)."""
    try:
        mf = reader.read_manifest(path, TrustStore(), allow_untrusted=True)
    except RecoveryError:
        return None
    tier = mf.recovery.get("tier")
    return tier if isinstance(tier, str) else None


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
