"""Promotion in one process: a local snapshot's files copied into the run directory
(issue 30, part 2; under ``torchrun``: :mod:`recovery.run.tiers.collective`).

The copy is :func:`recovery.integrity.commits.promote.promote` (each file hashed as it is written
and compared with the snapshot's signed digests, committed under a statement signed again:
``tier`` dropped, ``promoted: true``; the same files, so the same root digest), on the
local tier's promotion thread; then the commit is reported to the checkpointer as a
background save's is (lineage, retention, cost record with ``mode: promoted``, DVC).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from recovery.format.manifest import Manifest
from recovery.integrity.commits import promote
from recovery.integrity.keys.signing import Signer
from recovery.run.tiers.rules import Pins
from recovery.run.writing.background import BackgroundWriter
from recovery.run.writing.job import SaveJob
from recovery.run.writing.strategies import Committed, Cost

Then = Callable[[Path, Manifest, float], None]
"""What follows a committed snapshot: (its path, its manifest, the training thread's pause)."""


class FilePromotion:
    """Promotes local snapshots to the run directory by copying their files, one at a time
    on ``writer``.

    A snapshot being copied is ``pinned`` (never retired) until its copy is done."""

    def __init__(
        self,
        signer: Signer,
        committed: Committed,
        check: Callable[[], None],
        writer: BackgroundWriter,
        pinned: Pins,
    ) -> None:
        self.signer = signer
        self.committed = committed
        self.check = check
        """Raises unless the local directory is still the one the tier made (before a read)."""
        self.writer = writer
        self.pinned = pinned

    def then(self, job: SaveJob, *, waited: float) -> Then:
        """What follows ``job``'s step's snapshot: its promotion (:meth:`submit`)."""

        def then(path: Path, mf: Manifest, pause: float) -> None:
            self.submit(job, path, mf, pause=pause, waited=waited)

        return then

    def submit(
        self, job: SaveJob, path: Path, mf: Manifest, *, pause: float, waited: float
    ) -> None:
        """Copy the snapshot ``path`` to ``job.final`` on the promotion thread, then report the
        commit (``committed``); the caller has waited for the previous promotion."""
        self.pinned.add(job.step)
        recovery = {k: v for k, v in mf.recovery.items() if k != "tier"}
        recovery["promoted"] = True

        def run() -> Path:
            begun = time.perf_counter()
            try:
                self.check()
                persisted = promote.promote(
                    path, mf, job.final, signer=self.signer, recovery=recovery
                )
                cost = Cost(pause, waited, time.perf_counter() - begun, "promoted")
                self.committed(job, persisted, cost)
            finally:
                self.pinned.discard(job.step)
            return job.final

        self.writer.submit(run)
