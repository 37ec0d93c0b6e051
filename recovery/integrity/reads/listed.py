"""A committed directory's signed manifest, and the listing checks every verifier runs first.

:func:`check`, in this order, each with its own error: ``model.sig`` present;
its signature valid and its signer trusted (before anything else is read); the
statement well formed; every listed name a plain relative path; no symlinks
anywhere in the directory; no listed file missing; no unlisted file or
directory present; each file's size the listed one. What reads the files
next: :func:`recovery.integrity.reads.reader.read_verified` (the bytes, for
decoding) and :func:`recovery.integrity.reads.hashonly.check` (digests and headers
only, no torch).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from recovery.errors import (
    CheckpointNotFoundError,
    DigestMismatchError,
    ExtraFileError,
    ManifestError,
    MissingFileError,
    RecoveryError,
    SignatureError,
    TruncatedFileError,
    UnreadableFileError,
    UnsafePathError,
)
from recovery.format import manifest
from recovery.format.layout import SIGNATURE_FILE, is_uncommitted, parse_step
from recovery.format.manifest import FileRecord, Manifest
from recovery.integrity.keys import signing
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import notcheckpoint


def read_nofollow(path: Path) -> bytes:
    """A file's bytes, opened without following a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    finally:
        os.close(fd)


def _walk(root: Path) -> tuple[set[str], list[str], set[str]]:
    """Regular files under ``root`` as posix relpaths, every symlink found, every directory."""
    files: set[str] = set()
    links: list[str] = []
    dirs: set[str] = set()
    stack = [root]
    while stack:
        current = stack.pop()
        for entry in os.scandir(current):
            rel = Path(entry.path).relative_to(root).as_posix()
            if entry.is_symlink():
                links.append(rel)
            elif entry.is_dir(follow_symlinks=False):
                dirs.add(rel)
                stack.append(Path(entry.path))
            else:
                files.add(rel)
    return files, links, dirs


@contextmanager
def readable(path: Path) -> Iterator[None]:
    """Turn an operating-system refusal to read (other than a missing file, which the
    checks name) into :class:`~recovery.errors.UnreadableFileError`: a checkpoint that
    cannot be read is as unusable as a damaged one, and ``latest`` falls back past it."""
    try:
        yield
    except RecoveryError:
        raise
    except OSError as err:
        where = err.filename or path
        raise UnreadableFileError(
            f"{where}: cannot be read ({err.strerror or err}); fix its permissions or the "
            "storage, or resume from another checkpoint",
            path=Path(where),
        ) from err


def read_manifest(path: Path, trust: TrustStore, *, allow_untrusted: bool = False) -> Manifest:
    """Verify the signature of the directory ``path`` and parse its statement.

    No other file is read.

    Raises:
        CheckpointNotFoundError: ``path`` is no checkpoint: nothing there, a file, or a run
            directory (the message says which, and what to pass instead).
        ManifestError: no ``model.sig`` (an uncommitted directory) or a malformed statement.
        SignatureError, UntrustedSignerError: see
            :func:`recovery.integrity.keys.signing.verify_bundle`.
        UnreadableFileError: ``model.sig`` or the directory cannot be read.
    """
    with readable(Path(path)):
        return _read_manifest(path, trust, allow_untrusted=allow_untrusted)


def _read_manifest(path: Path, trust: TrustStore, *, allow_untrusted: bool) -> Manifest:
    if path.is_symlink():
        raise UnsafePathError(f"{path}: is a symlink; expected a checkpoint directory", path=path)
    if not path.is_dir():
        raise CheckpointNotFoundError(notcheckpoint.not_a_directory(path), path=path)
    file = path / SIGNATURE_FILE
    if is_uncommitted(path.name):
        raise ManifestError(
            f"{path}: is the temp directory of a checkpoint write that never committed; "
            "it is never used. A starting run removes it.",
            path=path,
        )
    try:
        st = os.lstat(file)
    except FileNotFoundError:
        raise notcheckpoint.unsigned(path) from None
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(
            f"{file}: expected a regular file, found a symlink or special file", path=file
        )
    if st.st_size > signing.MAX_BUNDLE_BYTES:  # refused unread: no input sizes our memory
        raise SignatureError(
            f"{file}: {st.st_size} bytes, expected a signature bundle of at most "
            f"{signing.MAX_BUNDLE_BYTES}; the directory cannot be trusted. Resume from another "
            "checkpoint.",
            path=file,
        )
    check = signing.verify_bundle(
        read_nofollow(file), trust, where=file, allow_untrusted=allow_untrusted
    )
    mf = manifest.parse(check.payload, where=path, signer=check)
    named = parse_step(path.name)
    if named is not None and named != mf.step:
        raise ManifestError(
            f"{path}: directory name says step {named}, its manifest says step {mf.step}; "
            "the directory was renamed or swapped. Resume from another checkpoint.",
            path=file,
        )
    return mf


def check(
    path: Path, trust: TrustStore, *, allow_untrusted: bool = False
) -> tuple[Manifest, dict[str, int]]:
    """Verify the signature of ``path``, then its listing: ``(manifest, size of each listed
    file)``. No file but ``model.sig`` is read.

    Raises:
        What :func:`read_manifest` raises; UnsafePathError (a symlink), MissingFileError,
        ExtraFileError (an unlisted file or directory), TruncatedFileError.
    """
    mf = read_manifest(path, trust, allow_untrusted=allow_untrusted)
    present, links, dirs = _walk(path)
    if links:
        raise UnsafePathError(
            f"{path}: contains symlink(s) {sorted(links)}; a checkpoint holds regular files only. "
            "Copy the checkpoint without following links, or resume from another one.",
            path=path / sorted(links)[0],
        )
    names = {rec.name for rec in mf.files}
    missing = sorted(names - present)
    if missing:
        raise MissingFileError(
            f"{path}: manifest lists {missing}, not found on disk; the checkpoint is incomplete. "
            "Resume from another checkpoint (or fetch it again from its remote).",
            path=path / missing[0],
        )
    # a directory no listed file lives in is as unlisted as a file (an empty one included)
    holding = {parent.as_posix() for name in names for parent in PurePosixPath(name).parents}
    extra = sorted((present - names - {SIGNATURE_FILE}) | {f"{d}/" for d in dirs - holding})
    if extra:
        raise ExtraFileError(
            f"{path}: holds {extra}, which the manifest does not list; something was added "
            "after the commit. Remove the extra files if you know them, or resume from "
            "another checkpoint.",
            path=path / extra[0],
        )
    sizes = {rec.name: _size(path, rec) for rec in mf.files}
    return mf, sizes


def _size(path: Path, rec: FileRecord) -> int:
    """A listed file's size on disk, which must be the recorded one.

    Raises:
        TruncatedFileError.
    """
    file = path / rec.name
    found = os.lstat(file).st_size
    if rec.size >= 0 and found != rec.size:
        raise TruncatedFileError(
            f"{file}: expected {rec.size} bytes, found {found}; the file was "
            "truncated or rewritten. Resume from another checkpoint.",
            path=file,
        )
    return found


def mismatch(file: Path, algorithm: str, expected: str, found: str) -> DigestMismatchError:
    """The error for a listed file whose digest is not the signed one."""
    return DigestMismatchError(
        f"{file}: expected {algorithm} {expected}, found {found}; "
        "the bytes changed after the commit. Resume from another checkpoint.",
        path=file,
    )
