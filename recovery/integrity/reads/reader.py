"""Verify a committed directory and hand back exactly the bytes that were hashed.

Nothing is deserialised here but the JSON that says which files belong
(below): :func:`read_verified` checks each listed file's size, reads it once
into memory (tensor files into one buffer each, hashed while they arrive; the
files at once, one per core), checks its digest
against the manifest (sha256, or the blake3 the manifest names), and returns
those bytes. Decoders then parse the same bytes, so there is no window between
"checked" and "used" in which the file could change.

Checks, each with its own error, in this order: the signature, trust and listing
checks of :func:`recovery.integrity.reads.listed.check`; each file's digest;
then every listed file claimed by ``state.json`` (:mod:`recovery.format.claims`:
a file a key holder signed in that nothing gives a meaning is refused like an
unlisted one). JSON of ``state.json`` and shard indexes is all that is parsed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from recovery.format import claims, digests, tensorfile
from recovery.format.layout import TENSOR_SUFFIX
from recovery.format.manifest import FileRecord, Manifest
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import listed
from recovery.integrity.reads.listed import read_manifest as read_manifest
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
        with listed.readable(file):
            return _read_one(self.directory, self.record, self.size, self.algorithm, _ignore)


def _ignore(n: int) -> None:
    """A progress callback that shows nothing."""


@dataclass(frozen=True)
class Verified:
    """A verified directory: its manifest and the verified bytes of each file.

    ``.safetensors`` files come as one uint8 tensor each (decoded zero-copy by
    :func:`recovery.format.tensorfile.views`); every other file, DCP's
    (``dcp/...``) included, as ``bytes``: DCP reads those through
    :class:`recovery.integrity.reads.dcp.VerifiedReader`, never from disk. A file the
    caller deferred is a :class:`Deferred`, verified when it is read.
    """

    path: Path
    manifest: Manifest
    files: dict[str, bytes | torch.Tensor | Deferred]


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

    The first failure found is raised, naming the file, what was expected and what was
    found.

    Raises:
        CheckpointNotFoundError: no such checkpoint directory.
        ManifestError: the manifest is missing or malformed.
        SignatureError: ``model.sig`` is malformed or its signature does not verify.
        UntrustedSignerError: signed by a key outside ``trust``.
        UnsafePathError: an unsafe path or a symlink in the directory.
        MissingFileError: a listed file is missing.
        ExtraFileError: an unlisted file, or a signed file ``state.json`` does not claim.
        TruncatedFileError: a file has the wrong size.
        DigestMismatchError: a file's digest does not match.
        UnreadableFileError: a file exists but cannot be read.
        FormatError: a malformed shard index.
    """
    path = Path(path)
    with listed.readable(path):
        return _read_verified(path, trust, allow_untrusted=allow_untrusted, defer=defer)


def _read_verified(
    path: Path,
    trust: TrustStore,
    *,
    allow_untrusted: bool,
    defer: Callable[[str], bool] | None,
) -> Verified:
    mf, sizes = listed.check(path, trust, allow_untrusted=allow_untrusted)
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
        data = listed.read_nofollow(file)
        digest = digests.of(data, algorithm)
        progress(len(data))
    if digest != rec.digest:
        raise listed.mismatch(file, algorithm, rec.digest, digest)
    return data
