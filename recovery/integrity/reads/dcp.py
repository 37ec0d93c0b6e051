"""DCP reads the verified bytes, never the disk; and what DCP writes is hashed as it is synced.

``torch.distributed.checkpoint`` unpickles ``dcp/.metadata`` and loads each
shard record with ``torch.load`` when *it* decides to, from the paths its
storage reader opens. Handing it the directory after verifying it would leave
a window in which a writer swaps a file between the hash and the load (no key
needed: ``.metadata`` is a pickle). :class:`VerifiedReader` is a DCP storage
reader whose file system is the dictionary of verified bytes that
:func:`recovery.integrity.reads.reader.read_verified` returned: every byte DCP
deserialises is a byte that was hashed, and a name that was not verified is
refused instead of read. Rejected: re-hashing the files just before DCP opens
them (a smaller window is still a window). Under ``torchrun`` each rank defers
the verification of the shards (:class:`~recovery.integrity.reads.reader.Deferred`)
to the moment DCP asks for one: a rank reads and hashes only the shards its
load plan reads, and DCP gets the very bytes that were just hashed.

:class:`HashingWriter` is DCP's own file-system writer whose every file is
hashed as it is made durable: when DCP closes a file, its fsync and a read of
the same file back through a second descriptor run at once, so each rank
knows the sha256 of the shards it wrote and the hash hides under the wait for
the disk (measured: fsync with the read-back hash took as long as fsync alone,
0.84-0.98 s per rank for 385 MB). Rejected: hashing each buffer as DCP writes
it, on the writer's thread (the sha256 came on top of the save, 0.3 s per rank
on two cores), and on a thread of its own (``torch.save`` hands its stream
views of memory it may free once the call returns: only the file's bytes
outlive the write); reading the shards back after the save (a third of a bare
``dcp.save``).
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

from torch.distributed.checkpoint.filesystem import (
    FileSystem,
    FileSystemBase,
    FileSystemReader,
    FileSystemWriter,
)

from recovery.errors import FormatError
from recovery.format import tensorfile
from recovery.format.layout import DCP_DIR
from recovery.integrity.reads.reader import Deferred


class _VerifiedFiles(FileSystemBase):
    """A read-only file system over ``{"dcp/<name>": bytes}``, rooted at ``<checkpoint>/dcp``."""

    def __init__(self, files: Mapping[str, Any], root: Path) -> None:
        self.files = files
        self.root = root

    def _key(self, path: str | os.PathLike[str]) -> str:
        try:
            rel = PurePosixPath(Path(path).relative_to(self.root).as_posix())
        except ValueError:
            rel = PurePosixPath(str(path))
        return f"{DCP_DIR}/{rel}"

    @contextmanager
    def create_stream(
        self, path: str | os.PathLike[str], mode: str
    ) -> Generator[io.IOBase, None, None]:
        if mode != "rb":
            self._read_only(path)
        data = self.files.get(self._key(path))
        if isinstance(data, Deferred):  # this rank's part of the shards: verified now
            data = data.read()
        if not isinstance(data, bytes):
            raise FormatError(
                f"{self.root.parent}: DCP asked for {self._key(path)}, which is not among the "
                "checkpoint's verified files; the checkpoint is incomplete or not a DCP one. "
                "Resume from another checkpoint.",
                path=self.root.parent,
            )
        yield io.BytesIO(data)  # shares the verified buffer (BytesIO copies on write only)

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> Path:
        return Path(path) / suffix

    def init_path(self, path: str | os.PathLike[str]) -> Path:
        return Path(path)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return self._key(path) in self.files

    def _read_only(self, path: str | os.PathLike[str]) -> NoReturn:
        raise FormatError(f"{path}: verified checkpoint bytes are read-only", path=Path(path))

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        self._read_only(path)

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        self._read_only(path)

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        self._read_only(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False


class VerifiedReader(FileSystemReader):
    """A DCP storage reader over a verified checkpoint's ``dcp/`` bytes.

    Args:
        files: the verified files (``Verified.files``); its ``dcp/...`` entries are read.
        where: the checkpoint directory, for names in messages (nothing is read there).
    """

    def __init__(self, files: Mapping[str, Any], *, where: Path) -> None:
        super().__init__(where / DCP_DIR)
        # torch annotates FileSystem; any FileSystemBase serves, and one of our own (not a
        # FileSystem subclass) cannot inherit a method that reads the disk
        self.fs = _VerifiedFiles(files, where / DCP_DIR)  # type: ignore[assignment]


class _HashingStream(io.RawIOBase):
    """A file opened for writing that, on close, is fsynced while a second descriptor on
    the same file (opened with it: the same inode, whatever happens to the name) reads it
    back and hashes it; :attr:`digest` and :attr:`size` are then the file's."""

    def __init__(self, raw: Any, path: Path) -> None:
        super().__init__()
        self._raw = raw
        self._path = path
        self._back = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        self.written = 0
        self.digest = ""
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        written = self._raw.write(data)
        self.written += written
        return int(written)

    def tell(self) -> int:
        return int(self._raw.tell())

    def fileno(self) -> int:
        return int(self._raw.fileno())

    def flush(self) -> None:
        if not self._raw.closed:
            self._raw.flush()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush()
            self._durable_and_hashed()
        finally:
            self._raw.close()
            os.close(self._back)
            super().close()

    def _durable_and_hashed(self) -> None:
        result: list[tuple[str, int] | BaseException] = []

        def hash_back() -> None:
            try:
                result.append(tensorfile.hash_fd(self._back))
            except BaseException as err:  # re-raised on the writer's thread below
                result.append(err)

        reader = threading.Thread(target=hash_back, name="recovery-dcp-hash", daemon=True)
        reader.start()
        try:
            os.fsync(self._raw.fileno())  # releases the GIL, as the read and sha256 do
        finally:
            reader.join()
        outcome = result[0]
        if isinstance(outcome, BaseException):
            raise outcome
        self.digest, self.size = outcome
        if self.size != self.written:
            raise OSError(
                f"{self._path}: {self.written} bytes written but {self.size} read back; "
                "the file changed while it was written. Save again."
            )


class _HashingFiles(FileSystem):
    """DCP's local file system, recording ``name -> (sha256, size)`` of each file it writes
    (names relative to the DCP directory; a rename carries the record along)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.records: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def _name(self, path: str | os.PathLike[str]) -> str:
        return Path(path).relative_to(self.root).as_posix()

    @contextmanager
    def create_stream(
        self, path: str | os.PathLike[str], mode: str
    ) -> Generator[io.IOBase, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with Path(path).open(mode) as raw:
            stream = _HashingStream(raw, Path(path))
            try:
                yield stream
            finally:
                stream.close()
        with self._lock:
            self.records[self._name(path)] = (stream.digest, stream.size)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        with self._lock:
            if (record := self.records.pop(self._name(path), None)) is not None:
                self.records[self._name(new_path)] = record


class HashingWriter(FileSystemWriter):
    """DCP's file-system writer into ``directory``, every file fsynced before DCP goes on
    (by its stream, with the hash: DCP's own ``sync_files`` is off so as not to fsync
    twice); after a save, :attr:`records` holds the sha256 and size of every file this
    rank wrote there."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, sync_files=False)
        self._files = _HashingFiles(Path(directory))
        self.fs = self._files  # type: ignore[assignment]

    @property
    def records(self) -> dict[str, tuple[str, int]]:
        """File name (relative to the DCP directory) -> (sha256 hex, size)."""
        return dict(self._files.records)
