"""Writing under a run directory without following a symlink someone else planted there.

Whoever can write into a run directory can plant a symlink under a name the
writer is about to use: ``.lock`` or ``metrics.jsonl`` pointing at a file
outside (the writer, often root, would overwrite it), ``abandoned/<branch>``
or ``best`` pointing at a directory outside (a committed checkpoint would be
moved or copied out). ``open()``, ``mkdir -p`` and ``rename`` into a directory
all follow such links; ``O_NOFOLLOW`` and the ``*at()`` calls on a directory
descriptor do not. So the writer:

- opens the files it appends to (lock, journal, tracking record) with
  ``O_NOFOLLOW`` (:func:`open_append`);
- moves checkpoints between directories through descriptors opened component
  by component with ``O_NOFOLLOW`` from the run directory (:func:`rename`), so
  no link on the way is followed, whenever it is planted;
- checks the names it is about to create, replace or delete (:func:`refuse_link`,
  :func:`refuse_links`), and that its own temp directory is still the one it made
  (:class:`Made`) before each file it writes into it and before publishing it.

The run directory itself (the path the user configured, links above it
included) is the anchor: it is trusted as given, and a writer notices when its
name comes to name another directory (:meth:`recovery.integrity.commits.lock.RunLock.check`).
Every refusal is an :class:`~recovery.errors.UnsafePathError` (exit 5) naming
the link, where it points and what to do; nothing is written through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import IO

from recovery.errors import UnsafePathError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _refusal(path: Path, what: str) -> UnsafePathError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return UnsafePathError(
        f"{path}: expected {what}, found a symlink (to {target!r}) that this writer did not "
        "make; a writer never writes, moves or deletes through a link. Remove the link (keep "
        "a copy of what it points to if you need it), then requeue with +resume=latest",
        path=path,
    )


def refuse_link(path: Path, what: str) -> None:
    """Refuse ``path`` when it is a symlink (absent is fine).

    Raises:
        UnsafePathError: it is a symlink.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise _refusal(path, what)


def refuse_links(anchor: Path, path: Path, what: str) -> None:
    """Refuse ``path`` when it or any directory between ``anchor`` (trusted, excluded) and it
    is a symlink. ``path`` must lie under ``anchor``.

    Raises:
        UnsafePathError: naming the first symlink.
    """
    current = anchor
    for part in path.relative_to(anchor).parts:
        current = current / part
        refuse_link(current, what if current == path else "a directory of the run")


def open_append(path: Path, what: str) -> IO[str]:
    """``path`` opened for appending text (and reading, by ``os.pread`` on its descriptor),
    created if absent, never through a symlink.

    Raises:
        UnsafePathError: ``path`` is a symlink.
    """
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _refusal(path, what) from err
        raise
    try:
        plain_file(fd, path, what)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


def plain_file(fd: int, path: Path, what: str) -> None:
    """Refuse an opened ``path`` that is not a regular file with one name: a FIFO would hang
    the writer, a device or a second hard link would take its writes elsewhere.

    Raises:
        UnsafePathError: naming what was found.
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        found = (
            "a regular file with other names (a hard link)"
            if stat.S_ISREG(st.st_mode)
            else ("no regular file (a FIFO, socket or device)")
        )
        raise UnsafePathError(
            f"{path}: expected {what}, found {found}; a writer writes only its own files. "
            "Remove it, then requeue with +resume=latest",
            path=path,
        )


def _walk(anchor: Path, rel: Path, *, create: bool) -> int:
    """A descriptor of ``anchor/rel``, opened one component at a time without following a
    link (created where absent when ``create``)."""
    fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, part in enumerate(rel.parts, 1):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = anchor.joinpath(*rel.parts[:depth])
                    what = f"a directory of the run (on the way to {anchor / rel})"
                    raise _refusal(where, what) from err
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def rename(anchor: Path, src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst`` (both under ``anchor``; ``dst``'s directories are created)
    without following a symlink on the way to either, or ``src`` itself being one.

    Raises:
        UnsafePathError: a symlink on either path; nothing moved.
    """
    src_fd = _walk(anchor, src.parent.relative_to(anchor), create=False)
    try:
        dst_fd = _walk(anchor, dst.parent.relative_to(anchor), create=True)
        try:
            if stat.S_ISLNK(os.stat(src.name, dir_fd=src_fd, follow_symlinks=False).st_mode):
                raise _refusal(src, "a checkpoint directory")
            os.rename(src.name, dst.name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            os.fsync(dst_fd)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


_MADE: dict[Path, Made] = {}


class Made:
    """A directory this writer just created, recognised later by its inode: a name that now
    names anything else (a symlink swapped in) is refused."""

    def __init__(self, path: Path) -> None:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise (
                _refusal(path, "the temp directory this writer made")
                if stat.S_ISLNK(st.st_mode)
                else UnsafePathError(
                    f"{path}: expected the temp directory this writer made, found no directory; "
                    "nothing was committed",
                    path=path,
                )
            )
        self.path = path
        self._id = (st.st_dev, st.st_ino)

    @classmethod
    def register(cls, path: Path) -> Made:
        """Recognise ``path``, made just now, when :meth:`take` is asked for it later (a
        distributed save's temp directory exists long before its commit)."""
        made = _MADE[path] = cls(path)
        return made

    @classmethod
    def forget(cls, path: Path) -> None:
        """Drop what :meth:`register` recorded for ``path`` (a save abandoned before its commit)."""
        _MADE.pop(path, None)

    @classmethod
    def take(cls, path: Path) -> Made:
        """The directory registered for ``path``, or ``path`` recognised now (made just now)."""
        return _MADE.pop(path, None) or cls(path)

    def check(self) -> None:
        """Raises:
        UnsafePathError: the name no longer names the directory this writer made."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return  # gone: the write that follows fails and says so
        if (st.st_dev, st.st_ino) != self._id:
            if stat.S_ISLNK(st.st_mode):
                raise _refusal(self.path, "the temp directory this writer made")
            raise UnsafePathError(
                f"{self.path}: the temp directory this writer made was replaced by another "
                "while it wrote; nothing was committed. Find out what else writes the run "
                "directory, then requeue with +resume=latest",
                path=self.path,
            )


def copy_tree(source: Path, dest_parent: Path, name: str) -> None:
    """Copy the directory ``source`` (files and subdirectories; a symlink in it is refused)
    to the new directory ``dest_parent/name``: every directory and file created through a
    descriptor of its parent, never following a link, each file new (``O_EXCL``), mode
    0644 and fsynced. ``dest_parent`` is opened without following a link.

    Raises:
        UnsafePathError: a symlink in ``source`` or at ``dest_parent``.
    """
    try:
        parent = os.open(dest_parent, _DIR_FLAGS)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refusal(dest_parent, "a directory of the run") from err
        raise
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
        _copy_into(source, os.open(name, _DIR_FLAGS, dir_fd=parent))
        os.fsync(parent)
    finally:
        os.close(parent)


def _copy_into(source: Path, fd: int) -> None:
    try:
        for entry in sorted(os.scandir(source), key=lambda e: e.name):
            if entry.is_symlink():
                raise _refusal(Path(entry.path), "a file of a checkpoint")
            if entry.is_dir(follow_symlinks=False):
                os.mkdir(entry.name, 0o755, dir_fd=fd)
                _copy_into(Path(entry.path), os.open(entry.name, _DIR_FLAGS, dir_fd=fd))
                continue
            src = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                dst = os.open(entry.name, flags, 0o644, dir_fd=fd)
                try:
                    size = os.fstat(src).st_size
                    done = 0
                    while done < size:
                        done += os.sendfile(dst, src, done, size - done) or size
                    os.fsync(dst)
                finally:
                    os.close(dst)
            finally:
                os.close(src)
        os.fsync(fd)
    finally:
        os.close(fd)


def private_dirs(path: Path) -> None:
    """Create ``path`` and each missing directory above it with mode 0700, whatever the
    umask (``mkdir(parents=True)`` gives the parents the umask's mode: with Debian's
    per-user-group umask 002 a key directory would be group-writable, which the dev key
    search refuses to believe)."""
    missing = []
    for directory in [path, *path.parents]:
        if directory.exists():
            break
        missing.append(directory)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
