"""A slow shared store for benchmarks: a FUSE passthrough file system whose reads and writes
share one link of a set bandwidth.

    python benchmarks/slowstore.py BACKING MOUNTPOINT --mbps 20

mounts ``BACKING`` (a directory) at ``MOUNTPOINT`` until it is unmounted
(``fusermount -u MOUNTPOINT``) or killed. Every byte read or written through the
mount waits for its turn on the link: ``--mbps`` megabytes (10^6 bytes) a second in
all, whichever file and thread, as a network file system or an object store gives
one client, while metadata (open, rename, fsync, listing) costs no more than the
disk under it. The kernel's page cache is not kept across opens, so a file read back
after it was written crosses the link again.

:func:`mounted` does it from Python for the time of a ``with`` block. It needs
``/dev/fuse``, Debian's ``fuse3`` and ``libfuse2`` and the ``fusepy`` package; without
them :func:`missing` says what to install.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def missing() -> str | None:
    """What this machine lacks to mount a slow store (``None``: nothing)."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse (a kernel with FUSE, and a container allowed to use it)"
    if shutil.which("fusermount") is None and shutil.which("fusermount3") is None:
        return "Debian's fuse3 (apt-get install fuse3 libfuse2)"
    try:
        import fuse  # noqa: F401
    except (ImportError, OSError) as err:
        return f"fusepy with libfuse2 (apt-get install libfuse2; pip install fusepy): {err}"
    return None


class Link:
    """One link of ``mbps`` megabytes a second: each transfer waits for the ones before it."""

    def __init__(self, mbps: float) -> None:
        self.rate = mbps * 1e6
        self._free = time.monotonic()
        self._lock = threading.Lock()

    def carry(self, nbytes: int) -> None:
        """Return once ``nbytes`` have crossed the link."""
        with self._lock:
            start = max(self._free, time.monotonic())
            self._free = start + nbytes / self.rate
            done = self._free
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def _operations(backing: Path, link: Link) -> Any:
    from fuse import FuseOSError, Operations

    root = str(backing)

    def real(path: str) -> str:
        return root + path

    def call(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except OSError as err:
            raise FuseOSError(err.errno or errno.EIO) from err

    class Passthrough(Operations):  # type: ignore[misc]
        """Every call goes to ``backing``; data crosses the link."""

        def access(self, path: str, amode: int) -> None:
            if not os.access(real(path), amode):
                raise FuseOSError(errno.EACCES)

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = call(os.lstat, real(path))
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size")
            keys += ("st_atime", "st_mtime", "st_ctime", "st_blocks", "st_ino")
            return {k: getattr(st, k) for k in keys}

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *call(os.listdir, real(path))]

        def readlink(self, path: str) -> str:
            return str(call(os.readlink, real(path)))

        def statfs(self, path: str) -> dict[str, Any]:
            sv = call(os.statvfs, real(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree")
            keys += ("f_files", "f_flag", "f_frsize", "f_namemax")
            return {k: getattr(sv, k) for k in keys}

        def chmod(self, path: str, mode: int) -> None:
            call(os.chmod, real(path), mode)

        def chown(self, path: str, uid: int, gid: int) -> None:
            call(os.chown, real(path), uid, gid)

        def mkdir(self, path: str, mode: int) -> None:
            call(os.mkdir, real(path), mode)

        def rmdir(self, path: str) -> None:
            call(os.rmdir, real(path))

        def unlink(self, path: str) -> None:
            call(os.unlink, real(path))

        def symlink(self, target: str, source: str) -> None:
            call(os.symlink, source, real(target))

        def link(self, target: str, source: str) -> None:
            call(os.link, real(source), real(target))

        def rename(self, old: str, new: str) -> None:
            call(os.rename, real(old), real(new))

        def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
            call(os.utime, real(path), times)

        def truncate(self, path: str, length: int, fh: int | None = None) -> None:
            call(os.truncate, real(path), length)

        def open(self, path: str, flags: int) -> int:
            return int(call(os.open, real(path), flags))

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            return int(call(os.open, real(path), flags, mode))

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            data = call(os.pread, fh, size, offset)
            link.carry(len(data))
            return bytes(data)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            link.carry(len(data))
            return int(call(os.pwrite, fh, data, offset))

        def flush(self, path: str, fh: int) -> None:
            return None

        def fsync(self, path: str, datasync: int, fh: int) -> None:
            call(os.fdatasync if datasync else os.fsync, fh)

        def release(self, path: str, fh: int) -> None:
            call(os.close, fh)

    return Passthrough()


def serve(backing: Path, mountpoint: Path, mbps: float) -> None:
    """Mount ``backing`` at ``mountpoint`` behind a link of ``mbps``, until unmounted."""
    from fuse import FUSE

    FUSE(
        _operations(backing.resolve(), Link(mbps)),
        str(mountpoint),
        foreground=True,
        nothreads=False,
        big_writes=True,
        max_write=1 << 20,
        allow_other=False,
        default_permissions=True,
    )


@contextlib.contextmanager
def mounted(backing: Path, mountpoint: Path, mbps: float) -> Iterator[Path]:
    """``backing`` mounted at ``mountpoint`` behind a link of ``mbps`` for the block.

    Raises:
        RuntimeError: the mount did not come up within 20 s (what the server printed).
    """
    backing.mkdir(parents=True, exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, str(backing), str(mountpoint), "--mbps", str(mbps)]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(mountpoint):
            if server.poll() is not None or time.monotonic() > deadline:
                out = server.stdout.read().decode(errors="replace") if server.stdout else ""
                raise RuntimeError(f"slow store at {mountpoint} did not mount: {out.strip()}")
            time.sleep(0.05)
        yield mountpoint
    finally:
        unmount = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount"
        subprocess.run([unmount, "-u", "-z", str(mountpoint)], check=False, capture_output=True)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("backing", type=Path)
    p.add_argument("mountpoint", type=Path)
    p.add_argument("--mbps", type=float, required=True, help="megabytes a second, in all")
    args = p.parse_args()
    serve(args.backing, args.mountpoint, args.mbps)


if __name__ == "__main__":
    main()
