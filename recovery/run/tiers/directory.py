"""The local tier's directory of one rank: made private, checked, refused for reuse, removed.

:class:`~recovery.run.tiers.snapshots.LocalTier` writes and reads snapshots there; this is the
directory's life (:mod:`recovery.integrity.commits.private` for what "private" means).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recovery.errors import RecoveryError, RunDirInUseError, UnsafePathError
from recovery.format.layout import scan
from recovery.integrity.commits import commit, private
from recovery.run.tiers import rules

log = logging.getLogger(__name__)


class LocalDir:
    """``<checkpoint.local.root>/<run>-<digest>/rank<r>/`` of one run directory and rank."""

    def __init__(self, root: str, run_dir: Path, rank: int) -> None:
        self.root = private.expand(root)
        self.dir = rules.local_dir(root, run_dir, rank)
        self._private: private.PrivateDir | None = None
        """The local directory, held open once :meth:`prepare` made or checked it."""

    def reserve(
        self,
        nbytes: int,
        freeable: list[Path],
        *,
        staging: int,
        copies: int,
        every: int,
        event: Callable[[dict[str, Any]], None],
    ) -> None:
        """Check that ``copies`` snapshots of ``nbytes`` fit (the ``freeable`` ones counted as
        free: :func:`recovery.run.tiers.rules.fit`), then say what they reserve (log, journal).

        Raises:
            StorageError: they do not fit (one line, before the first step).
        """
        available = rules.fit(self.dir, nbytes, freeable, staging=staging, copies=copies)
        log.info(
            "local tier: %s, a snapshot every %d steps, about %.1f MiB each, at most %d held "
            "(%.1f MiB of %.1f MiB free)",
            self.dir,
            every,
            nbytes / (1 << 20),
            copies,
            copies * nbytes / (1 << 20),
            available / (1 << 20),
        )
        event(
            {
                "event": "local_tier",
                "dir": str(self.dir),
                "every_steps": every,
                "snapshot_bytes": nbytes,
                "held_max": copies,
                "free_bytes": available,
            }
        )

    def held(self) -> list[tuple[int, Path]]:
        """The committed snapshots in the local directory, oldest first (not verified)."""
        return scan(self.dir).committed

    def prepare(self) -> None:
        """Before a resume looks here: create the directory and those above it up to the
        root (each 0700, this user's; existing ones checked to be: :mod:`recovery.integrity.
        private`) and remove what dead snapshot writes left (under the run directory's lock,
        taken first).

        Raises:
            StorageError: ``checkpoint.local.root`` cannot hold it (one line naming the key).
            UnsafePathError: a directory on the way is a symlink, another user's, or writable
                by others; the directory holds a symlink.
        """
        self._private = private.PrivateDir(self.root, self.dir, key="checkpoint.local.root")
        self._refuse_links()
        commit.remove_stale(self.dir)

    def _refuse_links(self) -> None:
        # nothing of ours is a link here: one planted (a "newer snapshot" pointing elsewhere)
        # is refused now, before any step, not when a retirement meets it later
        with os.scandir(self.dir) as entries:
            planted = sorted(e.name for e in entries if e.is_symlink())
        if planted:
            raise UnsafePathError(
                f"{self.dir}: holds symlinks, which the local tier never writes: "
                f"{', '.join(planted)}; remove them (and check who can write here)",
                path=self.dir / planted[0],
            )

    def check(self) -> None:
        """Before writing into or deleting from the local directory: it is still the private
        directory :meth:`prepare` made or checked.

        Raises:
            UnsafePathError, StorageError: it is not.
        """
        if self._private is not None:
            self._private.check()

    def refuse_reuse(self) -> None:
        """A fresh run (no ``+resume=``) does not start over another run's snapshots.

        Raises:
            RunDirInUseError: the local directory holds snapshots.
        """
        if held := self.held():
            raise RunDirInUseError(
                f"{self.dir}: holds local snapshots up to step {held[-1][0]} of an earlier run "
                "in this run directory (a run directory deleted and made again included). "
                "Delete that directory for a new run; pass +resume=latest only to continue "
                "the run that wrote them.",
                path=self.dir,
            )

    def _remove(self) -> None:
        try:
            self.check()  # never delete through a directory swapped in since
        except RecoveryError as err:
            log.warning("not removing the local tier's directory: %s", err)
            return
        shutil.rmtree(self.dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # the run's one above it, once no rank uses it
            self.dir.parent.rmdir()
