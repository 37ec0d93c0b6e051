"""Atomic commit of a checkpoint directory.

Protocol (POSIX): write every file into ``<final>.tmp-<id>/`` beside the final
place, hashing each chunk as it is written and fsyncing each file (the files
at once, one per core: sha256 of one file runs on one core, and both the
writes and hashlib release the GIL); sign the
statement of those digests and write it as ``model.sig``, last, and fsync it;
fsync the temp directory; ``rename`` it to
``<final>``; fsync the parent. A reader that finds ``<final>`` therefore finds
every byte the manifest lists; a crash at any earlier point leaves only a temp
directory, which discovery ignores and :func:`remove_stale` deletes.

If ``<final>`` already exists (a step re-saved after resuming from an earlier
checkpoint, or a corrupt directory left by a fault), it is first renamed aside,
then the new directory is renamed in, then the old one is deleted: at no point
is there a moment without a complete checkpoint of every other step, and a
kill between the two renames (fault point ``commit-aside-N``) leaves the old
one aside, which :func:`remove_stale` puts back. A committed directory is
deleted (:func:`discard`) by renaming it to a trash name first.

Rejected: a ``latest`` pointer file updated after the rename. It is a second
thing to keep consistent, and a crash between the two leaves it wrong.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from recovery import faults
from recovery.errors import CommitError, StorageError
from recovery.format import digests, manifest, tensorfile
from recovery.format.layout import (
    ASIDE_MARK,
    SIGNATURE_FILE,
    TRASH_MARK,
    aside_dir_for,
    committed_name,
    scan,
    temp_dir_for,
)
from recovery.format.manifest import FileRecord, Manifest
from recovery.integrity import nofollow
from recovery.integrity.commits import full, lock
from recovery.integrity.commits.reaping import discard as discard
from recovery.integrity.commits.reaping import fsync_dir as fsync_dir
from recovery.integrity.commits.reaping import fsync_file as fsync_file
from recovery.integrity.keys.signing import Signer
from recovery.progress import bytes_bar

log = logging.getLogger(__name__)

CHUNK = tensorfile.CHUNK


def write_file(
    path: Path,
    data: bytes,
    *,
    fault_point: str | None = None,
    algorithm: str = digests.SHA256,
) -> FileRecord:
    """Write ``data`` to a new file, hashing while writing, and fsync it."""
    view = memoryview(data)
    parts = [view[i : i + CHUNK] for i in range(0, len(view), CHUNK)] or [view]
    return tensorfile.write_stream(path, parts, fault_point=fault_point, algorithm=algorithm)


def write_entry(
    path: Path,
    content: bytes | Mapping[str, torch.Tensor],
    *,
    fault_point: str | None = None,
    progress: Callable[[int], None] | None = None,
    algorithm: str = digests.SHA256,
) -> FileRecord:
    """Write one file: raw bytes, or a tensor mapping streamed as safetensors."""
    if isinstance(content, bytes | bytearray | memoryview):
        return write_file(path, bytes(content), fault_point=fault_point, algorithm=algorithm)
    return tensorfile.write_stream(
        path,
        tensorfile.chunks(content),
        fault_point=fault_point,
        progress=progress,
        algorithm=algorithm,
    )


def _write_all(
    tmp: Path,
    files: Mapping[str, bytes | Mapping[str, torch.Tensor]],
    *,
    step: int,
    algorithm: str,
    progress: Callable[[int], None],
    made: nofollow.Made,
    faults_as: str = "commit",
) -> list[FileRecord]:
    """Write ``files`` into ``tmp`` on a pool of threads, largest first; their records in
    the given order. Every write finishes (or fails) before this returns or raises.
    Before each file, ``tmp`` must still be the directory ``made`` recorded."""
    ticking = threading.Lock()

    def tick(n: int) -> None:
        with ticking:
            progress(n)

    def one(i: int, name: str, data: bytes | Mapping[str, torch.Tensor]) -> FileRecord:
        made.check()  # each file is created O_EXCL: never through a link in its own name
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        point = f"{faults_as}-write-{step}" if i == 0 else None
        rec = write_entry(tmp / name, data, fault_point=point, progress=tick, algorithm=algorithm)
        return FileRecord(name, rec.digest, rec.size)

    items = list(files.items())
    order = sorted(
        range(len(items)),
        key=lambda i: -(len(d) if isinstance(d := items[i][1], bytes) else tensorfile.size_of(d)),
    )
    threads = tensorfile.workers(len(items))
    with ThreadPoolExecutor(threads, thread_name_prefix="recovery-write") as pool:
        futures = {i: pool.submit(one, i, *items[i]) for i in order}
    return [futures[i].result() for i in range(len(items))]


def commit(
    final: Path,
    files: Mapping[str, bytes | Mapping[str, torch.Tensor]],
    recovery: dict[str, Any],
    *,
    signer: Signer,
    tmp: Path | None = None,
    adopt: Sequence[str | FileRecord] = (),
    hash_type: str = digests.SHA256,
    faults_as: str = "commit",
) -> Manifest:
    """Write ``files`` and their signed manifest, then atomically publish them as ``final``.

    Args:
        final: the committed directory's path (its parent must exist).
        files: file name (a relative posix path) -> bytes, or a tensor mapping
            written as safetensors, in this order.
        recovery: the statement's ``recovery`` predicate (must hold ``step``); the
            signer's description is added as ``signer``.
        signer: signs the statement into ``model.sig``.
        tmp: a temp directory (:func:`~recovery.format.layout.temp_dir_for`) that already
            exists, holding files other processes wrote (the ranks of a
            distributed save); default: a new one.
        adopt: files already in ``tmp`` (fsynced by their writers) to list in the
            manifest with ``files``: a name is hashed here; a record is taken
            as its writer hashed it (with ``hash_type``).
        hash_type: every file's digest algorithm (:data:`recovery.format.digests.ALGORITHMS`).
        faults_as: the prefix of its :mod:`recovery.faults` points (``commit-write-N``...):
            ``local`` and ``promote`` for the tiers' commits of the same step.

    Returns:
        The manifest that was committed.

    Raises:
        CommitError: the write failed; the temp directory is removed and every
            previously committed checkpoint is untouched.
        UnsafePathError: ``final`` or the temp directory is (or became) a symlink this
            writer did not make; nothing was written through it.
        RunDirLockedError: the writer's lock no longer guards the run directory
            (:func:`recovery.integrity.commits.lock.check_held`); nothing was published.
    """
    step = recovery["step"]
    lock.check_held(final.parent)  # nothing written into a directory the lock lost
    try:
        if tmp is None:
            tmp = temp_dir_for(final)
            tmp.mkdir()
        made = nofollow.Made.take(tmp)
        records = [
            item
            if isinstance(item, FileRecord)
            else FileRecord(item, *tensorfile.hash_file(tmp / item, algorithm=hash_type))
            for item in adopt
        ]
        total = sum(tensorfile.size_of(d) for d in files.values() if not isinstance(d, bytes))
        with bytes_bar(total, f"saving {final.name}") as progress:
            records += _write_all(
                tmp,
                files,
                step=step,
                algorithm=hash_type,
                progress=progress,
                made=made,
                faults_as=faults_as,
            )
        for sub in sorted((p for p in tmp.rglob("*") if p.is_dir()), reverse=True):
            fsync_dir(sub)  # entries in dcp/, ranks/ (their files were fsynced by their writers)
        faults.reach(f"{faults_as}-before-manifest-{step}")
        statement = manifest.build(
            final.name, records, {**recovery, "signer": signer.describe()}, hash_type=hash_type
        )
        body = manifest.payload(statement)
        made.check()
        write_file(tmp / SIGNATURE_FILE, signer.sign(body))
        fsync_dir(tmp)
        faults.reach(f"{faults_as}-before-rename-{step}")
        # the last moment before publishing: the lock still guards the run, and neither
        # name is a link someone planted
        lock.check_held(final.parent)
        made.check()
        nofollow.refuse_link(final, "a committed checkpoint (or nothing)")
        aside = None
        if final.exists():
            aside = aside_dir_for(final)
            log.warning(
                "replacing existing %s (moved aside to %s, then deleted)", final, aside.name
            )
            os.rename(final, aside)
            faults.reach(f"{faults_as}-aside-{step}")  # the old aside, the new not yet in place
        os.rename(tmp, final)
        fsync_dir(final.parent)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    except OSError as err:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        lock.check_held(final.parent)  # the run directory replaced mid-write: say that
        if (no_room := full.cause(err)) is not None:
            raise full.refused(no_room, final.parent) from err
        if not final.parent.is_dir():
            raise StorageError(
                f"{final.parent}: the run directory is gone (deleted while the run was writing "
                f"it); checkpoint {final.name} was not written. Restore the directory (or its "
                "copy) and requeue with +resume=latest",
                path=final.parent,
            ) from err
        raise CommitError(
            f"could not commit checkpoint {final}: {err}. Earlier checkpoints are intact; "
            "check free space and permissions of the checkpoint root.",
            path=final,
        ) from err
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest.parse(body, where=final)


def remove_stale(run_dir: Path) -> list[Path]:
    """Delete what interrupted commits and deletions left; warn for each. Returns them.

    Only one process may write checkpoints into a run directory at a time (the
    caller holds its lock), so any temp directory seen by a starting run is a
    dead write and any trash directory a deletion that was cut short. An aside
    directory whose committed name is free is the old checkpoint of a re-save
    killed between its two renames: it is renamed back, not deleted.
    """
    removed = []
    for path in scan(run_dir).stale:
        final = path.with_name(committed_name(path.name))
        if path.is_symlink():  # not ours: removing the link itself follows nothing
            log.warning("removing %s: a symlink under a temp name, not made by a writer", path)
            path.unlink()
            continue
        if ASIDE_MARK in path.name and not final.exists():
            log.warning("restoring %s from %s: a re-save was interrupted", final, path.name)
            os.rename(path, final)
            fsync_dir(run_dir)
            continue
        why = (
            "a deletion that was cut short"
            if TRASH_MARK in path.name
            else "an interrupted checkpoint write that never committed"
        )
        log.warning("removing %s: %s", path, why)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
