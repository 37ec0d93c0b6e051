"""One writer per run directory: an exclusive kernel lock held for the life of a writing run.

Two ``train.py`` processes on one run directory used to mix their step
records, and the second removed the first's in-flight temp directory as
"stale". The writer now holds ``flock(LOCK_EX)`` on ``<run>/.lock`` from its
start to its end. The kernel drops the lock when the process dies, by SIGKILL
too, so there is no stale lock to detect or break; and because the starting
writer holds it before it removes temp directories, every temp directory it
removes is one no live writer owns. Readers (``ls``, ``verify``, ``inspect``,
``audit``) never take it. Rejected: a pid file checked for liveness (pids are
reused, and checking then writing is a race). ``flock`` needs a filesystem that
honours it across the machines that share the run directory (local disks and
NFSv4 do).
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import time
from pathlib import Path
from typing import IO

from recovery.errors import RunDirLockedError

LOCK_FILE = ".lock"


class RunLock:
    """The exclusive writer's lock on a run directory (released by :meth:`release` or death)."""

    def __init__(self, handle: IO[str], path: Path) -> None:
        self._handle: IO[str] | None = handle
        self.path = path

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Take the lock, or refuse at once if another process holds it.

        Raises:
            RunDirLockedError: another writer holds it (its pid and host named).
        """
        path = run_dir / LOCK_FILE
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the run's life
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read()
            handle.close()
            raise RunDirLockedError(
                f"{run_dir}: another run is writing it ({describe(holder)}); two writers would "
                "mix one run's history. Wait for it to end or stop it, or write elsewhere "
                "(run.name= or checkpoint.root=). Reading (recovery ls/verify/inspect/audit) "
                "needs no lock.",
                holder=holder,
                path=run_dir,
            ) from None
        handle.seek(0)
        handle.truncate()
        me = {"pid": os.getpid(), "host": platform.node(), "since": time.time()}
        handle.write(json.dumps(me) + "\n")
        handle.flush()
        return cls(handle, path)

    def release(self) -> None:
        """Drop the lock (closing the file drops it; the file stays for the next writer)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def describe(holder: str) -> str:
    """``pid 4242 on host gpu-7, since 2026-12-01 10:15:03`` from a lock file's content."""
    try:
        rec = json.loads(holder)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(rec["since"])))
        return f"pid {int(rec['pid'])} on host {rec['host']}, since {since}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown: it had not yet recorded itself"
