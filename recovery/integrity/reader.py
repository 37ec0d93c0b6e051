"""Verify a committed directory and hand back exactly the bytes that were hashed.

Nothing is deserialised here but the JSON that says which files belong
(below): :func:`read_verified` checks each listed file's size, reads it once
into memory (tensor files into one buffer each, hashed while they arrive; the
files at once, one per core), checks its digest
against the manifest (sha256, or the blake3 the manifest names), and returns
those bytes. Decoders then parse the same bytes, so there is no window between
"checked" and "used" in which the file could change.

Checks, each with its own error, in this order: ``model.sig`` present; its
signature valid and its signer trusted (before anything else is read); the
statement well formed; every listed name a plain relative path; no symlinks
anywhere in the directory; no
listed file missing; no unlisted file present; each file's size, then digest;
then every listed file claimed by ``state.json`` (:mod:`recovery.format.claims`:
a file a key holder signed in that nothing gives a meaning is refused like an
unlisted one). JSON of ``state.json`` and shard indexes is all that is parsed.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch

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
from recovery.format import claims, digests, manifest, tensorfile
from recovery.format.layout import (
    SIGNATURE_FILE,
    TENSOR_SUFFIX,
    is_uncommitted,
    parse_step,
)
from recovery.format.manifest import FileRecord, Manifest
from recovery.integrity import notcheckpoint, signing
from recovery.integrity.signing import TrustStore
from recovery.progress import bytes_bar


@dataclass(frozen=True)
class Deferred:
    """A listed file whose size was checked and whose bytes are read and verified only
    when :meth:`read` is called (see ``defer`` of :func:`read_verified`)."""

    directory: Path
    record: FileRecord
    size: int
    algorithm: str

    def read(self) -> bytes | torch.Tensor:
        """The file's bytes, verified against the manifest now.

        Raises:
            DigestMismatchError, UnreadableFileError.
        """
        file = self.directory / self.record.name
        with _readable(file):
            return _read_one(self.directory, self.record, self.size, self.algorithm, _ignore)


def _ignore(n: int) -> None:
    """A progress callback that shows nothing."""


@dataclass(frozen=True)
class Verified:
    """A verified directory: its manifest and the verified bytes of each file.

    ``.safetensors`` files come as one uint8 tensor each (decoded zero-copy by
    :func:`recovery.format.tensorfile.views`); every other file, DCP's
    (``dcp/...``) included, as ``bytes``: DCP reads those through
    :class:`recovery.integrity.dcp.VerifiedReader`, never from disk. A file the
    caller deferred is a :class:`Deferred`, verified when it is read.
    """

    path: Path
    manifest: Manifest
    files: dict[str, bytes | torch.Tensor | Deferred]


def _read_nofollow(path: Path) -> bytes:
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
def _readable(path: Path) -> Iterator[None]:
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
        SignatureError, UntrustedSignerError: see :func:`recovery.integrity.signing.verify_bundle`.
        UnreadableFileError: ``model.sig`` or the directory cannot be read.
    """
    with _readable(Path(path)):
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
        _read_nofollow(file), trust, where=file, allow_untrusted=allow_untrusted
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


def read_verified(
    path: str | Path,
    trust: TrustStore,
    *,
    allow_untrusted: bool = False,
    defer: Callable[[str], bool] | None = None,
) -> Verified:
    """Verify the signature and every file of a committed directory; return the bytes.

    Args:
        path: the directory.
        trust: the public keys whose signatures are trusted.
        allow_untrusted: accept a valid signature by a key not in ``trust``.
        defer: names for which this says true are size-checked like every file but
            read and verified only when used (:class:`Deferred`): the DCP shards of a
            ``torchrun`` job, of which each rank reads only its own part.

    Raises:
        CheckpointNotFoundError, ManifestError, SignatureError, UntrustedSignerError,
        UnsafePathError, MissingFileError, ExtraFileError, TruncatedFileError,
        DigestMismatchError, UnreadableFileError: the first failure found, naming the
        file, what was expected and what was found (ExtraFileError also for a signed
        file ``state.json`` does not claim). FormatError: a malformed shard index.
    """
    path = Path(path)
    with _readable(path):
        return _read_verified(path, trust, allow_untrusted=allow_untrusted, defer=defer)


def _read_verified(
    path: Path,
    trust: TrustStore,
    *,
    allow_untrusted: bool,
    defer: Callable[[str], bool] | None,
) -> Verified:
    mf = read_manifest(path, trust, allow_untrusted=allow_untrusted)
    present, links, dirs = _walk(path)
    if links:
        raise UnsafePathError(
            f"{path}: contains symlink(s) {sorted(links)}; a checkpoint holds regular files only. "
            "Copy the checkpoint without following links, or resume from another one.",
            path=path / sorted(links)[0],
        )
    listed = {rec.name for rec in mf.files}
    missing = sorted(listed - present)
    if missing:
        raise MissingFileError(
            f"{path}: manifest lists {missing}, not found on disk; the checkpoint is incomplete. "
            "Resume from another checkpoint (or fetch it again from its remote).",
            path=path / missing[0],
        )
    # a directory no listed file lives in is as unlisted as a file (an empty one included)
    holding = {parent.as_posix() for name in listed for parent in PurePosixPath(name).parents}
    extra = sorted((present - listed - {SIGNATURE_FILE}) | {f"{d}/" for d in dirs - holding})
    if extra:
        raise ExtraFileError(
            f"{path}: holds {extra}, which the manifest does not list; something was added "
            "after the commit. Remove the extra files if you know them, or resume from "
            "another checkpoint.",
            path=path / extra[0],
        )
    sizes = {rec.name: _size(path, rec) for rec in mf.files}
    later = {rec.name for rec in mf.files if defer is not None and defer(rec.name)}
    lock = threading.Lock()
    with bytes_bar(sum(sizes.values()), f"verifying {path.name}") as bar:

        def progress(n: int) -> None:
            with lock:
                bar(n)

        def one(rec: FileRecord) -> bytes | torch.Tensor:
            return _read_one(path, rec, sizes[rec.name], mf.hash_type, progress)

        # largest first, so the last file to finish is a small one; results by name
        order = sorted((r for r in mf.files if r.name not in later), key=lambda r: -sizes[r.name])
        threads = tensorfile.workers(len(order))
        with ThreadPoolExecutor(threads, thread_name_prefix="recovery-read") as pool:
            futures = {rec.name: pool.submit(one, rec) for rec in order}
    # every read has finished; the first failure in listed order is the one reported
    blobs: dict[str, bytes | torch.Tensor | Deferred] = {
        rec.name: (
            Deferred(path, rec, sizes[rec.name], mf.hash_type)
            if rec.name in later
            else futures[rec.name].result()
        )
        for rec in mf.files
    }
    _check_claimed(path, blobs)
    return Verified(path=path, manifest=mf, files=blobs)


def _check_claimed(path: Path, blobs: dict[str, bytes | torch.Tensor | Deferred]) -> None:
    """Every listed file is one ``state.json`` gives a meaning (:func:`.claims.check`):
    a signature proves who listed a file, not that any decoder will ever look at it."""

    def read(name: str) -> bytes | None:
        blob = blobs.get(name)
        if isinstance(blob, Deferred):
            blob = blob.read()
        return blob if isinstance(blob, bytes) else None

    claims.check(path, blobs, read)


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


def _read_one(
    path: Path, rec: FileRecord, size: int, algorithm: str, progress: Callable[[int], None]
) -> bytes | torch.Tensor:
    """One listed file's verified content (``size`` bytes, hashed with ``algorithm``).

    Raises:
        DigestMismatchError, FormatError (blake3 without its package).
    """
    file = path / rec.name
    data: bytes | torch.Tensor
    if rec.name.endswith(TENSOR_SUFFIX):
        data, digest = tensorfile.read_hashed(
            file, size=size, algorithm=algorithm, progress=progress
        )
    else:
        data = _read_nofollow(file)
        digest = digests.of(data, algorithm)
        progress(len(data))
    if digest != rec.digest:
        raise DigestMismatchError(
            f"{file}: expected {algorithm} {rec.digest}, found {digest}; "
            "the bytes changed after the commit. Resume from another checkpoint.",
            path=file,
        )
    return data
