"""A full disk under a run: one cause, one error, whichever write met it first.

A disk that fills while a run writes is met by whatever writes next: a
checkpoint's tensor file or ``model.sig`` on the background thread, the
journal on the training thread, the journal record a commit adds. Each used to
end the run its own way (a commit error, exit 14, or a storage error, exit 28),
so the same full disk gave either code by a race. :func:`cause` finds the
no-space error wherever it sits in an exception's chain, and :func:`refused`
is the one error every writer raises for it: a
:class:`~recovery.errors.StorageError` (exit 28) naming the run directory,
with the same words whatever thread or moment met it.

``EFBIG`` counts too: a file the file system or the process's file-size limit
(``RLIMIT_FSIZE``) will not let grow is a disk full for the run, with the same
remedy.
"""

from __future__ import annotations

import errno
from pathlib import Path

from recovery.errors import StorageError

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""The ``errno`` values of a write the storage had no room for: disk full, quota, file size."""


def cause(err: BaseException | None) -> OSError | None:
    """The no-space ``OSError`` (:data:`NO_SPACE`) that is ``err`` or caused it, else ``None``.

    Follows ``__cause__`` and ``__context__``: a commit error raised from the write's
    ``OSError`` is a full disk as much as the ``OSError`` itself.
    """
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in NO_SPACE:
            return err
        err = err.__cause__ or err.__context__
    return None


def refused(err: OSError, run_dir: Path) -> StorageError:
    """The error a run ends with when ``err`` (a :func:`cause`) met a write under ``run_dir``.

    The message names the run directory and the kernel's words, never the file or step
    that met the full disk first, so that it is one message whichever that was.
    """
    return StorageError(
        f"{run_dir}: the disk is full ({err.strerror or err}): a checkpoint or the journal "
        "could not be written; every checkpoint committed before is intact. Free space (or "
        "raise the quota or file-size limit), then requeue with +resume=latest",
        path=run_dir,
    )
