"""The dependency record of a capture: every installed distribution, and the lock file.

Read once per process start (:func:`recovery.provenance.capture.capture`), so it
reads only what it records: each distribution's ``Name`` and ``Version``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path
from typing import Any

LOCK_FILES = ("uv.lock", "poetry.lock", "pylock.toml", "requirements.lock", "requirements.txt")
"""The project's lock file, the first of these found at its root."""


def _name_version(dist: importlib.metadata.Distribution) -> tuple[str | None, str]:
    """A distribution's ``Name`` and ``Version``, read from the head of its metadata.

    ``dist.metadata`` runs the e-mail parser over the whole file, long description
    included: a tenth of a second per hundred packages, paid by every process start.
    The two fields are plain header lines before the first blank line.
    """
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    name = version = None
    for line in text.splitlines():
        if not line.strip():
            break
        if name is None and line.startswith("Name:"):
            name = line[5:].strip()
        elif version is None and line.startswith("Version:"):
            version = line[8:].strip()
    if name is None or version is None:
        return dist.metadata["Name"], dist.version
    return name, version


def dependency_lock(root: Path) -> dict[str, Any]:
    """Installed distributions (sorted ``name==version``), their digest, and the lock file's."""
    names = sorted(
        {
            f"{(name or '?').lower().replace('_', '-')}=={version}"
            for name, version in map(_name_version, importlib.metadata.distributions())
        }
    )
    lock = next((root / n for n in LOCK_FILES if (root / n).is_file()), None)
    return {
        "packages": names,
        "sha256": hashlib.sha256("\n".join(names).encode()).hexdigest(),
        "lock_file": (
            {"name": lock.name, "sha256": hashlib.sha256(lock.read_bytes()).hexdigest()}
            if lock
            else None
        ),
    }
