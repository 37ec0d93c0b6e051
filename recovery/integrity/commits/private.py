"""A directory of this user's, in a place every user can write (``/dev/shm``).

The local tier keeps a run's snapshots (the model's weights) under
``checkpoint.local.root``, by default in ``/dev/shm``: mode 1777, shared by every
user of the node, and the path under it is predictable. Another user could
create a directory on that path first (and own it), or plant a symlink there,
and then read, remove or swap what the run writes. So every directory from the
root down is created mode 0700 by this user or, where it
exists, checked without following links (``lstat``) to be a directory of this
user's that no one else can write; the last one, where the snapshots go, must
be readable by no one else either. It is then held open (``O_NOFOLLOW``) and
:meth:`PrivateDir.check` recognises it by its inode before each write and
before it is deleted. Everything above the root (``/dev/shm`` itself) is
trusted as given, as a run directory's parents are.

Refusals name the config key the root came from: an unusable path (a file, no
permission) is a :class:`~recovery.errors.StorageError`, another user's or a
link an :class:`~recovery.errors.UnsafePathError`; one line each.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from recovery.errors import StorageError, UnsafePathError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def expand(root: str | Path) -> Path:
    """``root`` with ``~`` and ``{uid}`` (this process's effective uid) expanded: the default
    ``/dev/shm/recovery-{uid}`` gives each user of a node a root of their own."""
    return Path(str(root).replace("{uid}", str(os.geteuid()))).expanduser()


class PrivateDir:
    """``path`` (under ``root``), made or checked to be this user's and private, held open.

    Raises:
        StorageError: a directory on the way cannot be created or is not a directory.
        UnsafePathError: one is a symlink, another user's, or writable by others (``path``
            itself: readable by others).
    """

    def __init__(self, root: Path, path: Path, *, key: str) -> None:
        self.root = root
        self.path = path
        self.key = key
        self.made: list[Path] = []
        """The directories this created, outermost first (:meth:`remove_made`)."""
        self._fd: int | None = None
        try:
            self._id = self._walk(create=True)
            try:
                self._fd = os.open(path, _DIR_FLAGS)
            except OSError as err:
                raise self._unusable(path, err) from err
            if _identity(os.fstat(self._fd)) != self._id:
                self.close()
                raise self._unsafe(path, "was replaced while it was checked", self._remove())
        except (StorageError, UnsafePathError):
            self.remove_made()  # a refusal leaves nothing behind that it made
            raise

    def check(self) -> None:
        """That every directory from the root down is still this user's and private, and
        ``path`` still the directory held open.

        Raises:
            UnsafePathError: one changed (a link or another user's directory swapped in).
            StorageError: one is gone.
        """
        if self._fd is not None and self._walk() != _identity(os.fstat(self._fd)):
            what = "is no longer the directory this run made"
            raise self._unsafe(self.path, what, self._remove())

    def close(self) -> None:
        """Let go of the directory (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove_made(self) -> None:
        """Remove the directories this created below the root, innermost first, where they
        are still empty (a refused start leaves nothing behind it made). Never the root:
        another run of this user's may be about to make its own directory in it."""
        for directory in reversed(self.made):
            if directory != self.root:
                with contextlib.suppress(OSError):
                    os.rmdir(directory)

    def _chain(self) -> list[Path]:
        parts = self.path.relative_to(self.root).parts
        return [self.root] + [self.root.joinpath(*parts[: i + 1]) for i in range(len(parts))]

    def _walk(self, *, create: bool = False) -> tuple[int, int]:
        """Check each directory from the root down (creating it first when ``create`` and
        missing: never below one not yet checked); the last one's identity."""
        uid = os.geteuid()
        st = None
        for directory in self._chain():
            if create:
                try:
                    os.mkdir(directory, 0o700)  # the umask can only take bits away
                    self.made.append(directory)
                except FileExistsError:
                    pass
                except OSError as err:
                    raise self._unusable(directory, err) from err
            try:
                st = os.lstat(directory)
            except FileNotFoundError as err:
                if create:
                    raise self._unusable(directory, err) from err
                raise StorageError(
                    f"{self.key}: {directory} was removed while the run used it (a cleanup of "
                    "the node's RAM filesystem?): its local snapshots are gone, the persistent "
                    "checkpoints are not. Rerun with +resume=latest",
                    path=directory,
                ) from err
            except OSError as err:
                raise self._unusable(directory, err) from err
            if stat.S_ISLNK(st.st_mode):
                what = f"is a symlink (to {_target(directory)!r})"
                advice = f"Remove the link, or set {self.key}= elsewhere"
                raise self._unsafe(directory, what, advice)
            if not stat.S_ISDIR(st.st_mode):
                raise self._unusable(directory, None)
            mode = stat.S_IMODE(st.st_mode)
            if st.st_uid != uid:
                what = f"belongs to uid {st.st_uid}, not this user ({uid})"
                raise self._unsafe(directory, what, self._inside(directory))
            mask = 0o077 if directory == self.path else 0o022
            if mode & mask:
                who = "others can read or write it" if mask == 0o077 else "others can write it"
                if mode & stat.S_ISVTX:  # a shared directory such as /dev/shm itself
                    advice = self._inside(directory)
                else:
                    fix = "700" if mask == 0o077 else "go-w"
                    advice = f"If it is yours: chmod {fix} {directory}"
                raise self._unsafe(directory, f"has mode {mode:o} ({who})", advice)
        assert st is not None
        return _identity(st)

    def _unusable(self, directory: Path, err: OSError | None) -> StorageError:
        why = err.strerror if err is not None else "not a directory"
        return StorageError(
            f"{self.key}: cannot keep the local tier in {directory}: {why}. Set {self.key}= to "
            "a directory of your own on a node-local filesystem, or turn the local tier off "
            "(checkpoint.local.every_steps=0)",
            path=directory,
        )

    def _unsafe(self, directory: Path, what: str, advice: str) -> UnsafePathError:
        return UnsafePathError(
            f"{self.key}: {directory} {what}; the local tier writes only into directories of "
            f"this user's that no one else can write. {advice}",
            path=directory,
        )

    def _remove(self) -> str:
        return f"Remove it if it is yours, or set {self.key}= to a directory of your own"

    def _inside(self, directory: Path) -> str:
        """The advice for a directory that is shared or someone else's."""
        return (
            f"Use a directory of your own inside it: {self.key}={directory}/recovery-{{uid}} "
            "({uid}: your user id)"
        )


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"
