"""Deleting retired directories off the training thread.

Unlinking a checkpoint's files costs time in proportion to its size even in
the page cache (measured here: 0.63 s for 768 MB of fsynced files, 0.06 s
unsynced), and retention deletes one checkpoint per save: on the training
thread that was most of the gap between a distributed commit and a bare
``dcp.save``. A directory is first renamed to a trash name (atomic; from then
on no reader takes it for a checkpoint, see
:func:`recovery.integrity.commits.commit.discard`), then a :class:`Reaper`'s thread
deletes it. A process that dies first leaves only the trash directory, which
the next start removes (:func:`recovery.integrity.commits.commit.remove_stale`).
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
from pathlib import Path

from recovery import faults
from recovery.format.layout import trash_dir_for
from recovery.integrity import nofollow

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


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (creations, renames) durable."""
    _fsync(path, os.O_RDONLY | os.O_DIRECTORY)


def fsync_file(path: Path) -> None:
    """Make a file's content durable (a copy made by another means than
    :func:`recovery.integrity.commits.commit.write_file`)."""
    _fsync(path, os.O_RDONLY)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard(path: Path, *, fault_point: str | None = None, reaper: Reaper | None = None) -> None:
    """Delete a committed directory: rename it to a trash name (atomic: from then on no
    reader takes it for a checkpoint), then remove the files, here or on ``reaper``'s
    thread; a kill in between leaves only the trash directory, which
    :func:`recovery.integrity.commits.commit.remove_stale` finishes."""
    nofollow.refuse_link(path, "a committed checkpoint to delete")
    if not path.exists():
        return
    trash = trash_dir_for(path)
    os.rename(path, trash)
    fsync_dir(path.parent)
    if fault_point:
        faults.reach(fault_point)
    if reaper is not None:
        reaper.reap(trash)
    else:
        shutil.rmtree(trash, ignore_errors=True)
