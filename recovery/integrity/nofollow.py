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
name comes to name another directory (:meth:`recovery.integrity.lock.RunLock.check`).
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
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _refusal(path, what) from err
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


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


class Made:
    """A directory this writer just created, recognised later by its inode: a name that now
    names anything else (a symlink swapped in) is refused."""

    def __init__(self, path: Path) -> None:
        st = os.lstat(path)
        self.path = path
        self._id = (st.st_dev, st.st_ino)

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
