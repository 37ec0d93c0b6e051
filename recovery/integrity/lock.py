"""One writer per run directory: an exclusive kernel lock held for the life of a writing run.

Two ``train.py`` processes on one run directory used to mix their step
records, and the second removed the first's in-flight temp directory as
"stale". The writer now holds ``flock(LOCK_EX)`` on ``<run>/.lock`` from its
start to its end. The kernel drops the lock when the process dies, by SIGKILL
too, so there is no stale lock to detect or break; and because the starting
writer holds it before it removes temp directories, every temp directory it
removes is one no live writer owns. Readers (``ls``, ``verify``, ``inspect``,
``audit``) never take it. Rejected: a pid file checked for liveness (pids are
reused, and checking then writing is a race). One nuance: ``flock`` is
shared with forked children (DataLoader workers), which would keep holding it
for a moment after their parent was SIGKILLed; a forked child closes its copy
of the descriptor at once (``os.register_at_fork``), and a starting writer
whose recorded holder is a dead process of this host still waits for such
children (at most :data:`ORPHAN_WAIT_S`). ``flock`` needs a filesystem that
honours it across the machines that share the run directory (local disks and
NFSv4 do).
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import time
import weakref
from pathlib import Path
from typing import IO

from recovery.errors import RunDirLockedError

LOCK_FILE = ".lock"
ORPHAN_WAIT_S = 30.0
"""How long a starting writer waits when the recorded holder is dead but the lock is still
held: ``flock`` is shared with forked children (DataLoader workers), which outlive a
SIGKILLed parent for a moment."""


_HELD: weakref.WeakSet[RunLock] = weakref.WeakSet()


def _drop_in_child() -> None:
    # closing an inherited descriptor releases nothing (the parent's still refers to the
    # lock), but a child that outlives its parent then holds nothing either
    for lock in list(_HELD):
        if lock._handle is not None:
            lock._handle.close()
            lock._handle = None


os.register_at_fork(after_in_child=_drop_in_child)


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
        deadline = time.monotonic() + ORPHAN_WAIT_S
        while not _try_lock(handle):
            handle.seek(0)
            holder = handle.read()
            if not _dead_here(holder) or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # the writer is dead; its forked children still hold the lock
        else:
            return cls._hold(handle, path)
        handle.close()
        raise RunDirLockedError(
            f"{run_dir}: another run is writing it ({describe(holder)}); two writers would "
            "mix one run's history. Wait for it to end or stop it, or write elsewhere "
            "(run.name= or checkpoint.root=). Reading (recovery ls/verify/inspect/audit) "
            "needs no lock.",
            holder=holder,
            path=run_dir,
        )

    @classmethod
    def _hold(cls, handle: IO[str], path: Path) -> RunLock:
        handle.seek(0)
        handle.truncate()
        me = {"pid": os.getpid(), "host": platform.node(), "since": time.time()}
        handle.write(json.dumps(me) + "\n")
        handle.flush()
        lock = cls(handle, path)
        _HELD.add(lock)
        return lock

    def release(self) -> None:
        """Drop the lock (closing the file drops it; the file stays for the next writer)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _dead_here(holder: str) -> bool:
    """Whether the recorded holder is a process of this host that no longer runs."""
    try:
        rec = json.loads(holder)
        pid, host = int(rec["pid"]), str(rec["host"])
    except (ValueError, KeyError, TypeError):
        return False
    if host != platform.node():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a zombie (killed, not yet reaped) holds nothing
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def describe(holder: str) -> str:
    """``pid 4242 on host gpu-7, since 2026-12-01 10:15:03`` from a lock file's content."""
    try:
        rec = json.loads(holder)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(rec["since"])))
        return f"pid {int(rec['pid'])} on host {rec['host']}, since {since}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown: it had not yet recorded itself"
