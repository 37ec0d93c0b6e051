"""Promotion: a committed local-tier snapshot becomes a persistent checkpoint.

Nothing is serialised again and the training thread is not involved: every
file the snapshot's manifest lists is copied into a temp directory beside the
persistent place, hashed while it is written, and compared with the digest
that manifest records, so a byte changed in RAM since the snapshot committed
fails the promotion and never reaches the disk. Then the commit protocol of
:func:`recovery.integrity.commits.commit.commit` (fault points ``promote-write-N``,
``promote-before-manifest-N``, ``promote-before-rename-N``) signs a statement
of those same files, with the snapshot's provenance, and renames it into
place. The subject's root digest is a digest of the files alone, so the
persistent checkpoint and its local snapshot name the same state by the same
digest (a link to either stays valid).
"""

from __future__ import annotations

import mmap
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from recovery.errors import CommitError, RecoveryError
from recovery.format import tensorfile
from recovery.format.layout import temp_dir_for
from recovery.format.manifest import FileRecord, Manifest
from recovery.integrity import nofollow
from recovery.integrity.commits import commit, full, lock
from recovery.integrity.keys.signing import Signer
from recovery.integrity.reads import listed

CHUNK = tensorfile.CHUNK


def copy_verified(
    src: Path, dst: Path, rec: FileRecord, *, algorithm: str, point: str | None
) -> None:
    """Copy ``src`` to the new file ``dst`` (fsynced), hashing what is written.

    Raises:
        DigestMismatchError: the bytes are not the ones ``rec`` records (``dst`` is left
            for the caller to remove with its temp directory).
    """
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        if size != rec.size:
            raise listed.mismatch(src, "size", str(rec.size), str(size))
        if size == 0:
            got = tensorfile.write_stream(dst, [b""], fault_point=point, algorithm=algorithm)
        else:
            with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
                whole = memoryview(mapped)
                parts = [whole[i : i + CHUNK] for i in range(0, size, CHUNK)]
                try:
                    got = tensorfile.write_stream(
                        dst, parts, fault_point=point, algorithm=algorithm
                    )
                finally:  # the map closes only once no view of it is left
                    for part in parts:
                        part.release()
                    whole.release()
    finally:
        os.close(fd)
    if got.digest != rec.digest:
        raise listed.mismatch(src, algorithm, rec.digest, got.digest)


def promote(
    source: Path, mf: Manifest, final: Path, *, signer: Signer, recovery: dict[str, Any]
) -> Manifest:
    """Copy the committed snapshot ``source`` (whose manifest is ``mf``) to ``final``, atomically
    and signed, with ``recovery`` as the statement's predicate (it must hold ``step``).

    Returns:
        The persistent checkpoint's manifest (the same files and root digest as ``mf``).

    Raises:
        DigestMismatchError: a file of the snapshot changed since it was committed.
        CommitError, StorageError, UnsafePathError, RunDirLockedError: as
            :func:`recovery.integrity.commits.commit.commit`; nothing was published.
    """
    step = recovery["step"]
    tmp = temp_dir_for(final)
    lock.check_held(final.parent)  # nothing written into a directory the lock lost
    try:
        tmp.mkdir()
        # recognised by its inode before each file and by the commit (which takes it): a
        # name swapped for a link or another directory while the copy runs is refused
        made = nofollow.Made.register(tmp)
        for rec in mf.files:
            (tmp / rec.name).parent.mkdir(parents=True, exist_ok=True)

        def one(i: int, rec: FileRecord) -> None:
            made.check()
            point = f"promote-write-{step}" if i == 0 else None
            copy_verified(
                source / rec.name, tmp / rec.name, rec, algorithm=mf.hash_type, point=point
            )

        with ThreadPoolExecutor(tensorfile.workers(len(mf.files))) as pool:
            futures = [pool.submit(one, i, rec) for i, rec in enumerate(mf.files)]
        for future in futures:
            future.result()
    except BaseException as err:
        nofollow.Made.forget(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if (no_room := full.cause(err)) is not None and not isinstance(err, RecoveryError):
            raise full.refused(no_room, final.parent) from err
        if isinstance(err, OSError) and not isinstance(err, RecoveryError):
            raise CommitError(
                f"could not promote {source} to {final}: {err}. Earlier checkpoints are intact.",
                path=final,
            ) from err
        raise
    return commit.commit(
        final,
        {},
        recovery,
        signer=signer,
        tmp=tmp,
        adopt=list(mf.files),
        hash_type=mf.hash_type,
        faults_as="promote",
    )
