"""DCP reads the verified bytes, never the disk.

``torch.distributed.checkpoint`` unpickles ``dcp/.metadata`` and loads each
shard record with ``torch.load`` when *it* decides to, from the paths its
storage reader opens. Handing it the directory after verifying it would leave
a window in which a writer swaps a file between the hash and the load (no key
needed: ``.metadata`` is a pickle). :class:`VerifiedReader` is a DCP storage
reader whose file system is the dictionary of verified bytes that
:func:`recovery.integrity.reader.read_verified` returned: every byte DCP
deserialises is a byte that was hashed, and a name that was not verified is
refused instead of read. Rejected: re-hashing the files just before DCP opens
them (a smaller window is still a window).
"""

from __future__ import annotations

import io
import os
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader

from recovery.errors import FormatError
from recovery.format.layout import DCP_DIR


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
