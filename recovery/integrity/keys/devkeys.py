"""Where development keys are: one search order, the same from any working directory.

The order (the first directory holding a key pair wins for signing; every one found is
trusted when verifying):

1. ``signing.dev_key_dir`` when set, else ``$RECOVERY_DEV_KEY_DIR`` when set;
2. the project's ``.recovery/dev-key``: the nearest one found walking up from the run
   directory, then from the working directory, stopping at a git root or the filesystem
   root. Only a directory owned by this user and writable by nobody else counts (a
   ``/tmp/.recovery`` another user made is never one), and only a key made on this
   machine (registered, see below) counts, but for the working directory's own
   ``./.recovery/dev-key``: a downloaded tree may carry a key of its own anywhere, and
   running a command inside it must not make that key vouch for the tree's checkpoints;
3. the per-user ``$XDG_CONFIG_HOME/recovery/dev-key`` (``~/.config/recovery/dev-key``).

Besides, every dev key created on this machine registers its public key in
``$XDG_CONFIG_HOME/recovery/dev-keys/``, which is trusted from anywhere: a user's own
fresh checkpoints verify wherever the command runs, while a key that merely sits beside
a downloaded checkpoint (a ``.recovery/dev-key`` shipped inside it) is never trusted
by being found.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from recovery import access
from recovery.integrity.keys.signing import PUBLIC_KEY_FILE

log = logging.getLogger(__name__)

DEV_KEY_ENV = "RECOVERY_DEV_KEY_DIR"
PROJECT_DEV_KEY = Path(".recovery") / "dev-key"
"""A project's dev key directory, relative to the project's root."""


def user_dir() -> Path:
    """``$XDG_CONFIG_HOME/recovery`` (default ``~/.config/recovery``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "recovery"


def user_dev_key() -> Path:
    """The per-user dev key directory."""
    return user_dir() / "dev-key"


def registry() -> Path:
    """The public keys of every dev key created on this machine by this user."""
    return user_dir() / "dev-keys"


def _own(path: Path) -> bool:
    """Whether ``path`` (and its parent) belong to this user and no one else can write them."""
    try:
        stats = [path.stat(), path.parent.stat()]
    except OSError:
        return False
    uid = os.getuid() if hasattr(os, "getuid") else None
    return all((uid is None or s.st_uid == uid) and not s.st_mode & 0o022 for s in stats)


def registered_keys() -> list[Path]:
    """The registry's public key files that can be believed: the registry directory and
    each file this user's, writable by no one else (a shared or group-writable config
    directory would let another user plant a key trusted everywhere)."""
    folder = registry()
    if not _own(folder):
        if folder.exists():
            log.warning(
                "dev key registry %s ignored: not this user's, or writable by others", folder
            )
        return []
    keys = []
    for public in sorted(folder.glob("*.pub")):
        if public.is_file() and not public.is_symlink() and _own(public):
            keys.append(public)
        else:
            log.warning("dev key %s ignored: not this user's, or writable by others", public)
    return keys


def registered(public: Path) -> bool:
    """Whether the public key file ``public`` is one of this machine's dev keys."""
    try:
        pem = public.read_bytes()
        return any(f.read_bytes() == pem for f in registered_keys())
    except OSError:
        return False


def project_dev_key(start: Path, *, made_here: bool = False) -> Path | None:
    """The nearest ``.recovery/dev-key`` holding a public key, walking up from ``start``
    to a git root (a directory holding ``.git``) or the filesystem root; ``None``.

    Only a key registered as made on this machine counts, but for ``start``'s own when
    ``made_here`` is false (the working directory's ``./.recovery/dev-key``): a run
    directory, and anything above the working directory, may be a downloaded tree
    carrying a key of its own."""
    start = start.absolute()
    for directory in [start, *start.parents]:
        candidate = directory / PROJECT_DEV_KEY
        public = candidate / PUBLIC_KEY_FILE
        need = made_here or directory != start
        # another user's key is never this user's dev key: not even looked into
        if _own(candidate) and _is_file(public) and (not need or registered(public)):
            return candidate
        if (directory / ".git").exists():
            return None
    return None


def _is_file(public: Path) -> bool:
    """Whether this user's dev key directory holds ``public``.

    Raises:
        PermissionDeniedError: the directory is this user's, but its mode shuts them out.
    """
    try:
        return public.is_file()
    except PermissionError as err:
        remedy = f"or set ${DEV_KEY_ENV} to a dev key directory this user may read"
        raise access.denied(err, "the project's dev key", remedy) from err


@dataclass(frozen=True)
class Place:
    """One step of the search order: what it is, and the directory it names (if any)."""

    label: str
    path: Path | None

    def text(self) -> str:
        """``label: path`` (``label: none`` where nothing was found)."""
        return f"{self.label}: {self.path if self.path is not None else 'none'}"


def search(configured: str | None = None, near: Iterable[Path] = ()) -> list[Place]:
    """The search order for ``signing.dev_key_dir=configured``, the project walked up
    from each of ``near`` (a run directory) and then from the working directory."""
    places = []
    if configured:
        places.append(Place("signing.dev_key_dir", Path(configured)))
    elif os.environ.get(DEV_KEY_ENV):
        places.append(Place(f"${DEV_KEY_ENV}", Path(os.environ[DEV_KEY_ENV])))
    seen: set[Path] = set()
    for start, made_here in [*((p, True) for p in near), (Path.cwd(), False)]:
        found = project_dev_key(start, made_here=made_here)
        if found not in seen or found is None:
            places.append(Place(f"the project's {PROJECT_DEV_KEY} above {start}", found))
        if found is not None:
            seen.add(found)
    places.append(Place("the per-user dev key", user_dev_key()))
    return places
