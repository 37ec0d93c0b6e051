"""One background thread that commits snapshots, at most one in flight.

The checkpointer hands it a closure that serialises, hashes, signs, commits
and retains one staged snapshot. The next save waits for the previous one (the
staging buffers are reused), and the wait is logged. A failure in the
background is kept and raised on the training thread at the next step
boundary, so an error is never lost and never half-trusted (an uncommitted
write is only a temp directory).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from recovery.errors import CommitError, RunDirLockedError, StorageError, UnsafePathError

OWN_CODE = (StorageError, RunDirLockedError, UnsafePathError)
"""Errors a background save re-raises as they are: each names its cause with its own exit
code (a full disk, a lock that no longer guards the run, a planted symlink), which a
CommitError around them would hide."""

log = logging.getLogger(__name__)


class BackgroundWriter:
    """Runs save jobs one at a time on a worker thread."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recovery-save")
        self._pending: Future[Path] | None = None
        self.waited_s = 0.0

    @property
    def busy(self) -> bool:
        return self._pending is not None and not self._pending.done()

    @property
    def outstanding(self) -> bool:
        """A save was submitted and its outcome not yet collected (:meth:`wait`,
        :meth:`raise_if_failed`)."""
        return self._pending is not None

    @property
    def failed(self) -> bool:
        """The save submitted last has finished, and failed (not yet raised)."""
        job = self._pending
        return job is not None and job.done() and job.exception() is not None

    def raise_if_failed(self) -> None:
        """Raise the error of a finished background save, once: a
        :class:`~recovery.errors.StorageError` as it is (a full disk says the same whichever
        thread met it, :mod:`recovery.integrity.commits.full`) and the others of :data:`OWN_CODE` as
        they are, any other wrapped in a CommitError."""
        job = self._pending
        if job is not None and job.done():
            self._pending = None
            err = job.exception()
            if isinstance(err, OWN_CODE):  # its own code and words, whichever thread met it
                raise err
            if err is not None:
                said = str(err).rstrip(".")
                tail = "" if "intact" in said else ". Earlier checkpoints are intact"
                raise CommitError(
                    f"a background checkpoint save failed: {said}{tail}.",
                    path=getattr(err, "path", None),
                ) from err

    def wait(self) -> float:
        """Wait for the save in flight (if any); return the seconds waited.

        Raises:
            CommitError, StorageError (a full disk included): that save failed.
        """
        started = time.perf_counter()
        if self.busy:
            log.info("checkpoint: waiting for the previous background save to finish")
        job = self._pending
        if job is not None:
            with contextlib.suppress(BaseException):  # raised below, with context
                job.result()
        waited = time.perf_counter() - started
        self.waited_s += waited
        self.raise_if_failed()
        self._pending = None
        return waited

    def submit(self, job: Callable[[], Path]) -> None:
        """Start ``job``; the caller must have called :meth:`wait` first."""
        assert self._pending is None, "one save in flight at most"  # internal invariant
        self._pending = self._pool.submit(job)

    def close(self) -> float:
        """Wait for the save in flight, then stop the thread; return the seconds waited.

        Raises:
            CommitError, StorageError (a full disk included): the last save failed.
        """
        try:
            return self.wait()
        finally:
            self._pool.shutdown(wait=True)
