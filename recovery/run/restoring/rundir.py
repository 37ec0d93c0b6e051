"""Before a run touches its directory: create it, lock it, tidy what dead writers left.

Rank 0 creates the run directory, takes the writer's lock (one writer per run
directory) and only then removes the temp directories of dead writes and
finishes an interrupted move of an abandoned branch; a fresh run refuses a
directory that already holds checkpoints.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from recovery.errors import RecoveryError, StorageError
from recovery.format.layout import refuse_reuse as refuse_reuse  # the run's check
from recovery.integrity.commits import commit
from recovery.integrity.commits.lock import RunLock
from recovery.integrity.keys.signing import TrustStore
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.run.journal import segmenter
from recovery.run.restoring import branches, history
from recovery.run.restoring.history import History
from recovery.run.saving import retention


def prepare(
    run_dir: Path, world: World, journal: Path, events_trust: TrustStore
) -> tuple[RunLock | None, History | None]:
    """Before a run touches its directory: rank 0 creates it, takes the writer's lock, and
    only then removes the temp directories of dead writes and finishes an interrupted
    move of an abandoned branch (:mod:`recovery.run.restoring.branches`) that the journal's sealed
    events (verified with ``events_trust``) record; every rank waits for that.

    Returns:
        The lock (rank 0), to hold until the run ends, and the journal's history as it
        read it (rank 0; ``None`` elsewhere): a resume reads the journal once.

    Raises:
        RunDirLockedError: another process is writing ``run_dir``.
        StorageError: ``run_dir`` cannot be created or written (read-only, permissions).
    """
    lock, past = None, None
    if world.leader:
        try:
            made = not run_dir.exists()
            run_dir.mkdir(parents=True, exist_ok=True)
            lock = RunLock.acquire(run_dir)
            lock.made_dir = made
            # fail now, not at the first commit after minutes of training
            Path(tempfile.mkdtemp(prefix=".recovery-probe-", dir=run_dir)).rmdir()
            commit.remove_stale(run_dir)
            retention.tidy_best(run_dir)
            segmenter.catch_up(journal)  # an old journal indexed once, then read through it
            past = history.read(journal, events_trust)
            branches.finish(run_dir, past)
        except OSError as err:
            if lock is not None:
                lock.release()
            if isinstance(err, RecoveryError):
                raise
            raise StorageError(
                f"{err.filename or run_dir}: cannot write the run directory "
                f"({err.strerror or err}); the checkpoint root must be writable: fix its "
                "permissions or choose another checkpoint.root=",
                path=run_dir,
            ) from err
    distributed.barrier()
    return lock, past
