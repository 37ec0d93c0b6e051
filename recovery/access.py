"""A permission refused by the operating system, said in one line that names what to fix.

``PermissionError`` says only "Permission denied" and a path. :func:`denied` turns it into
a :class:`~recovery.errors.PermissionDeniedError` (exit 31) that also says what the path
was for, who owns it, its mode and which user this process runs as, so the fix (run as
the owner, change the mode, or point the setting elsewhere) is in the line itself.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from recovery.errors import PermissionDeniedError


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def describe(path: Path) -> str:
    """``owner nobody (uid 65534), mode 0600`` of ``path``, or of the nearest directory
    above it this process can see when ``path`` itself cannot be looked at."""
    for where in (path, *path.parents):
        try:
            st = where.stat()
        except OSError:
            continue
        mode = f"mode {stat.S_IMODE(st.st_mode):04o}"
        what = "" if where == path else f" ({where}, above it)"
        return f"owner {_user(st.st_uid)}, {mode}{what}"
    return "owner unknown"


def denied(err: PermissionError, what: str, remedy: str) -> PermissionDeniedError:
    """The one-line error for ``err``, met reading or writing ``what`` (e.g. "the signing
    key"); ``remedy`` says what to do besides fixing the permission."""
    where = Path(err.filename) if isinstance(err.filename, str) else None
    name = str(where) if where is not None else what
    seen = f"; {describe(where)}" if where is not None else ""
    me = _user(os.getuid()) if hasattr(os, "getuid") else "this user"
    also = f"; {remedy}" if remedy else ""
    return PermissionDeniedError(
        f"{name}: permission denied ({what}{seen}; this process runs as {me}): run as a "
        f"user who may use it, or change its permissions{also}",
        path=where,
    )
