"""Deleting retired directories off the training thread.

Unlinking a checkpoint's files costs time in proportion to its size even in
the page cache (measured here: 0.63 s for 768 MB of fsynced files, 0.06 s
unsynced), and retention deletes one checkpoint per save: on the training
thread that was most of the gap between a distributed commit and a bare
``dcp.save``. A directory is first renamed to a trash name (atomic; from then
on no reader takes it for a checkpoint, see
:func:`recovery.integrity.commit.discard`), then a :class:`Reaper`'s thread
deletes it. A process that dies first leaves only the trash directory, which
the next start removes (:func:`recovery.integrity.commit.remove_stale`).
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
from pathlib import Path

log = logging.getLogger(__name__)


class Reaper:
    """One background thread that deletes trash directories in the order given."""

    def __init__(self) -> None:
        self._todo: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def reap(self, trash: Path) -> None:
        """Delete ``trash`` (already renamed to a trash name) in the background."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="recovery-reaper", daemon=True
                )
                self._thread.start()
        self._todo.put(trash)

    def _run(self) -> None:
        while (trash := self._todo.get()) is not None:
            shutil.rmtree(trash, ignore_errors=True)
            if trash.exists():
                log.warning("could not delete %s; the next start removes it", trash)

    def close(self) -> None:
        """Wait for every deletion handed over so far, then stop the thread (a later
        :meth:`reap` starts another)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._todo.put(None)
            thread.join()
