"""Sending a committed snapshot directory from one rank to another over a process group.

The bytes travel as they are on disk (uint8 tensors: gloo carries tensors, never a pickled
object) and land in a temp directory that is renamed into place once every file is
written, so a receiver killed part-way leaves only a temp name (removed at the next
start). Nothing is verified on receipt: a copy is verified, signature and every digest,
when a resume reads it, as any snapshot is (:func:`recovery.run.restoring.choose.load`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

import numpy as np
import torch
import torch.distributed as dist

from recovery.errors import CommitError
from recovery.format.layout import temp_dir_for
from recovery.integrity.commits import reaping
from recovery.integrity.commits.reaping import fsync_dir

Group = dist.ProcessGroup | None
_TAGS = 1 << 16
"""Tags per peer: a round's messages to one peer are told apart by their tag."""
_HEADER_MAX = 1 << 24
"""The longest file list a peer may announce (bytes of JSON)."""
_ACK = _TAGS - 1
"""The tag (within a peer's) of the receiver's word that its copy is committed."""


def listing(path: Path) -> list[tuple[str, int]]:
    """The files under ``path`` (relative POSIX names, sizes), in name order."""
    found = [f for f in path.rglob("*") if f.is_file() and not f.is_symlink()]
    return sorted((f.relative_to(path).as_posix(), f.stat().st_size) for f in found)


def check_names(names: Sequence[tuple[str, int]], src: int) -> None:
    """Refuse a peer's file list that would write outside the directory it is written into,
    or twice to one place.

    Raises:
        CommitError: an absolute, empty or non-canonical name, a ``.`` or ``..``, a name
            given twice, or a negative size.
    """
    if len(names) > _TAGS - 3:  # one tag per file, beside the list's two and the answer's
        raise CommitError(f"rank {src} sent {len(names)} files, more than a snapshot holds")
    seen: set[str] = set()
    for name, size in names:
        path = PurePosixPath(name)
        canonical = bool(name) and path.as_posix() == name and not path.is_absolute()
        if not canonical or {".", ".."} & set(name.split("/")) or name in seen or size < 0:
            raise CommitError(
                f"rank {src} sent a snapshot file named {name!r} ({size} bytes), not a file "
                "of a snapshot directory; its copy is refused (does every rank run the same "
                "recovery version?)"
            )
        seen.add(name)


def _header(path: Path) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, int]]]:
    names = listing(path)
    raw = json.dumps(names).encode()
    return torch.tensor([len(raw)], dtype=torch.int64), _bytes(raw), names


def _bytes(raw: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0)


def _read(path: Path) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(path, dtype=np.uint8))


def exchange(
    send: Sequence[tuple[Path, int]], receive: Sequence[tuple[int, Path]], *, group: Group
) -> list[Path]:
    """Send each ``(directory, rank)`` of ``send`` and receive each ``(rank, final)`` of
    ``receive`` at once (every sender and receiver of a round calls it with the pairs it
    takes part in); each received directory is committed at its ``final`` path (an older
    one there is replaced). Returns, once every copy this rank sent is committed where it
    went, the received paths.

    Raises:
        CommitError: a peer sent an unsafe file name.
        RuntimeError (torch.distributed): a peer is gone.
    """
    pending = []
    headers = {path: _header(path) for path in {p for p, _ in send}}
    for k, (path, dst) in enumerate(send):
        length, raw, _ = headers[path]
        pending.append(dist.isend(length, dst, group=group, tag=k * _TAGS))
        if raw.numel():
            pending.append(dist.isend(raw, dst, group=group, tag=k * _TAGS + 1))
    read: dict[Path, torch.Tensor] = {}  # each file read once, whatever the peers it goes to
    for k, (path, dst) in enumerate(send):
        for i, (name, size) in enumerate(headers[path][2]):
            if size:
                if path / name not in read:
                    read[path / name] = _read(path / name)
                tensor = read[path / name]
                pending.append(dist.isend(tensor, dst, group=group, tag=k * _TAGS + 2 + i))
    # each receiver says once its copy is committed: a sender's round ends only then, so
    # what it does next (retire its older snapshot) never outruns the peers' copies
    acks = [torch.zeros(1, dtype=torch.int64) for _ in send]
    heard = [
        dist.irecv(a, dst, group=group, tag=k * _TAGS + _ACK)
        for k, (a, (_, dst)) in enumerate(zip(acks, send, strict=True))
    ]
    received = []
    for k, (src, final) in enumerate(receive):
        received.append(_receive(src, final, k, group))
        pending.append(
            dist.isend(torch.ones(1, dtype=torch.int64), src, group=group, tag=k * _TAGS + _ACK)
        )
    for work in [*pending, *heard]:
        if work is not None:
            work.wait()
    return received


def _receive(src: int, final: Path, k: int, group: Group) -> Path:
    length = torch.empty(1, dtype=torch.int64)
    dist.recv(length, src, group=group, tag=k * _TAGS)
    if not 0 <= int(length.item()) <= _HEADER_MAX:
        raise CommitError(
            f"rank {src} announced a snapshot file list of {int(length.item())} bytes"
        )
    raw = torch.empty(int(length.item()), dtype=torch.uint8)
    if raw.numel():
        dist.recv(raw, src, group=group, tag=k * _TAGS + 1)
    try:
        names = [(str(n), int(s)) for n, s in json.loads(bytes(raw.numpy()).decode() or "[]")]
    except (ValueError, TypeError) as err:
        raise CommitError(
            f"rank {src} sent a snapshot file list that does not parse: {err}"
        ) from err
    check_names(names, src)
    tmp = temp_dir_for(final)
    tmp.mkdir(parents=True, mode=0o700)
    try:
        for i, (name, size) in enumerate(names):
            buf = torch.empty(size, dtype=torch.uint8)
            if size:
                dist.recv(buf, src, group=group, tag=k * _TAGS + 2 + i)
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(buf.numpy().data)
                out.flush()
                os.fsync(out.fileno())
        if final.exists():
            reaping.discard(final)
        os.rename(tmp, final)
        fsync_dir(final.parent)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CommitError(
            f"{final}: the copy of rank {src}'s snapshot could not be written ({err}); the "
            "job stops, and resumes from the newest step that verifies",
            path=final,
        ) from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
