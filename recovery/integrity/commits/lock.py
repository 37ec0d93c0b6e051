"""One writer per run directory: an exclusive kernel lock held for the life of a writing run.

Two ``train.py`` processes on one run directory used to mix their step
records, and the second removed the first's in-flight temp directory as
"stale". The writer now holds ``flock(LOCK_EX)`` on **the run directory
itself** (a descriptor of the directory, not of a file in it) from its start
to its end. The kernel drops the lock when the process dies, by SIGKILL too,
so there is no stale lock to detect or break; and because the starting writer
holds it before it removes temp directories, every temp directory it removes
is one no live writer owns. Readers (``ls``, ``verify``, ``inspect``,
``audit``) never take it.

Why the directory: ``flock`` locks an inode, not a name. The lock used to be on
``<run>/.lock``, and deleting that file (or renaming another over it) let a
second writer lock a fresh inode under the same name while the first still
wrote: two writers, both exiting 0. A directory holding a run cannot be
removed while it has entries, and renaming it away takes the run's files with
it; what a name change can still do is put *another* directory under the run's
name, and the writer checks for exactly that (:meth:`RunLock.check`) before
each commit, stopping with :class:`~recovery.errors.RunDirLockedError` (exit 26)
rather than committing into a directory another writer may hold. ``.lock``
stays, as a record of the holder (pid, host, since) for the refusal message;
it is opened without following a symlink (a planted link is refused, never
written through). On a filesystem that refuses ``flock`` on a directory (some
NFS clients) the lock falls back to ``.lock`` itself, and :meth:`RunLock.check`
then also checks that the name still is the locked file.

Rejected: a pid file checked for liveness (pids are reused, and checking then
writing is a race). One nuance: ``flock`` is shared with forked children
(DataLoader workers), which would keep holding it for a moment after their
parent was SIGKILLed; a forked child closes its copies of the descriptors at
once (``os.register_at_fork``), and a starting writer whose recorded holder is
a dead process of this host still waits for such children (at most
:data:`ORPHAN_WAIT_S`). ``flock`` needs a filesystem that honours it across the
machines that share the run directory (local disks and NFSv4 do).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import platform
import time
import weakref
from pathlib import Path

from recovery.errors import RunDirLockedError
from recovery.integrity import nofollow

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
ORPHAN_WAIT_S = 30.0
"""How long a starting writer waits when the recorded holder is dead but the lock is still
held: ``flock`` is shared with forked children (DataLoader workers), which outlive a
SIGKILLed parent for a moment."""
_NO_DIR_FLOCK = (errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP)
"""``flock`` on a directory refused by the filesystem: lock the holder file instead."""


_HELD: weakref.WeakSet[RunLock] = weakref.WeakSet()


def _drop_in_child() -> None:
    # closing inherited descriptors releases nothing (the parent's still refer to the
    # lock), but a child that outlives its parent then holds nothing either
    for lock in list(_HELD):
        lock._close()


os.register_at_fork(after_in_child=_drop_in_child)


def _open_holder_file(dir_fd: int, run_dir: Path) -> int:
    path = run_dir / LOCK_FILE
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(LOCK_FILE, flags, 0o644, dir_fd=dir_fd)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        nofollow.refuse_link(path, "the writer's lock file")
        raise
    try:
        nofollow.plain_file(fd, path, "the writer's lock file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


class RunLock:
    """The exclusive writer's lock on a run directory (released by :meth:`release` or death)."""

    def __init__(self, run_dir: Path, dir_fd: int, file_fd: int, locked: int) -> None:
        self.run_dir = run_dir
        self.created = False
        """Whether taking the lock created ``.lock`` (see :meth:`release`)."""
        self.made_dir = False
        """Whether the writer created the run directory itself (set by its caller)."""
        self.path = run_dir / LOCK_FILE
        self._dir_fd: int | None = dir_fd
        self._file_fd: int | None = file_fd
        self._locked = locked  # the descriptor flock holds: the directory's, or the file's
        self._dir_id = _identity(os.fstat(dir_fd))
        self._file_id = _identity(os.fstat(file_fd))

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Take the lock, or refuse at once if another process holds it.

        Raises:
            RunDirLockedError: another writer holds it (its pid and host named).
            UnsafePathError: ``.lock`` is a symlink.
        """
        dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            existed = _exists(dir_fd)
            file_fd = _open_holder_file(dir_fd, run_dir)
        except BaseException:
            os.close(dir_fd)
            raise
        locked = dir_fd
        deadline = time.monotonic() + ORPHAN_WAIT_S
        while True:
            try:
                fcntl.flock(locked, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(file_fd)
                if _dead_here(holder) and time.monotonic() <= deadline:
                    time.sleep(0.1)  # the writer is dead; its forked children still hold it
                    continue
                break
            except OSError as err:
                if err.errno not in _NO_DIR_FLOCK or locked == file_fd:
                    os.close(dir_fd)
                    os.close(file_fd)
                    raise
                log.info("%s: no flock on a directory (%s); locking %s", run_dir, err, LOCK_FILE)
                locked = file_fd
                continue
            lock = cls._hold(run_dir, dir_fd, file_fd, locked)
            lock.created = not existed
            return lock
        os.close(dir_fd)
        os.close(file_fd)
        raise RunDirLockedError(
            f"{run_dir}: another run is writing it ({describe(holder)}); two writers would "
            "mix one run's history. Wait for it to end or stop it, or write elsewhere "
            "(run.name= or checkpoint.root=). Reading (recovery ls/verify/inspect/audit) "
            "needs no lock.",
            holder=holder,
            path=run_dir,
        )

    @classmethod
    def _hold(cls, run_dir: Path, dir_fd: int, file_fd: int, locked: int) -> RunLock:
        me = {"pid": os.getpid(), "host": platform.node(), "since": time.time()}
        os.ftruncate(file_fd, 0)
        os.pwrite(file_fd, (json.dumps(me) + "\n").encode(), 0)
        lock = cls(run_dir, dir_fd, file_fd, locked)
        _HELD.add(lock)
        return lock

    def check(self) -> None:
        """That the lock still guards the run: the run directory's name still names the
        locked directory (and, where ``.lock`` is what is locked, ``.lock`` that file).
        A run directory that is gone is left to the write that follows (it says so).

        Raises:
            RunDirLockedError: what changed; another writer may be writing the directory
                now under the run's name.
        """
        if self._dir_fd is None:
            return
        try:
            now = _identity(os.stat(self.run_dir))
        except FileNotFoundError:
            return
        if now != self._dir_id:
            raise self._lost(
                f"the run directory {self.run_dir} is now another directory (inode "
                f"{now[1]}, was {self._dir_id[1]}): it was moved or replaced while this "
                "run held its lock"
            )
        if self._locked == self._file_fd:
            try:
                st = os.stat(LOCK_FILE, dir_fd=self._dir_fd, follow_symlinks=False)
                file_now: tuple[int, int] | None = _identity(st)
            except FileNotFoundError:
                file_now = None
            if file_now != self._file_id:
                raise self._lost(f"its lock file {self.path} was deleted or replaced")

    def _lost(self, what: str) -> RunDirLockedError:
        return RunDirLockedError(
            f"{self.run_dir}: this writer's lock no longer guards the run: {what}. Another "
            "writer may be writing there now; stopping before the next commit. Find out who "
            "moved it, then requeue with +resume=latest",
            holder="",
            path=self.run_dir,
        )

    def _close(self) -> None:
        for fd in (self._dir_fd, self._file_fd):
            if fd is not None:
                os.close(fd)
        self._dir_fd = self._file_fd = None

    def release(self, *, tidy: bool = False) -> None:
        """Drop the lock (closing the descriptors drops it; ``.lock`` stays for the next
        writer). ``tidy``: a start-up that was refused leaves nothing behind: ``.lock`` is
        removed if taking the lock created it, and the run directory if the writer made it
        and it is empty."""
        if tidy and self._dir_fd is not None:
            if self.created:
                with contextlib.suppress(OSError):
                    # the name only: unlink never follows a link
                    os.unlink(LOCK_FILE, dir_fd=self._dir_fd)
            if self.made_dir:
                with contextlib.suppress(OSError):  # not empty: something else is there
                    os.rmdir(self.run_dir)
        self._close()


def check_held(path: Path) -> None:
    """Before a commit into ``path``: every lock this process holds on a directory that
    contains ``path`` still guards it (:meth:`RunLock.check`), and no directory between
    that run directory and ``path`` (``warm_start/``, ``best/``) is a symlink.

    Raises:
        RunDirLockedError: a lock no longer guards its run directory.
        UnsafePathError: a symlink on the way.
    """
    for lock in list(_HELD):
        if lock._dir_fd is not None and (path == lock.run_dir or lock.run_dir in path.parents):
            lock.check()
            nofollow.refuse_links(lock.run_dir, path, "a directory of the run")


def _exists(dir_fd: int) -> bool:
    try:
        os.stat(LOCK_FILE, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace")
    except OSError:
        return ""


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
