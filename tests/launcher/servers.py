"""The launcher's servers: one per profile and project root, started on first use,
shared by a test session's workers (:func:`share`); see :mod:`tests.launcher`."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.launcher.commands import _BASE_ENV, APPLIED_ENV, ROOT, SERVER


class Server:
    """One preloaded server process (started on first use) for a project ``root``."""

    def __init__(
        self,
        profile: str,
        *,
        attach: str | None = None,
        root: Path = ROOT,
        watch: int | None = None,
    ) -> None:
        """``attach``: the socket of a running server (in one of its children); ``watch``:
        a process whose end ends the server (else the end of this one)."""
        self.profile = profile
        self.root = root
        self.watch = watch
        self._proc: Any = None  # subprocess.Popen, or Forked for a copy's server
        self._attached = attach is not None
        self._dir = os.path.dirname(attach) if attach else tempfile.mkdtemp(prefix="launcher-")
        self.path = attach or os.path.join(self._dir, "sock")
        self._lock = threading.Lock()

    def _start(self) -> None:
        env = {k: v for k, v in _BASE_ENV.items() if k not in APPLIED_ENV}
        main = server(self.profile) if self.root != ROOT else None
        if main is not None:  # a copy's server: a child of this checkout's, which re-imports
            # the project's packages from the copy (the rest is preloaded already)
            from tests.launcher.forked import Forked

            self._proc = Forked(
                [sys.executable, "-c", ""],
                srv=main,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=self._dir,
                serve=(str(self.root), self.path),
            )
        else:
            self._proc = subprocess.Popen(
                [sys.executable, str(SERVER), self.path, self.profile, str(self.root)]
                + ([str(self.watch)] if self.watch else []),
                stdin=subprocess.DEVNULL if self.watch else subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=self._dir,
            )
        line = self._proc.stdout.readline() if self._proc.stdout else ""
        if line.strip() != "ready":
            self._proc.wait()
            raise RuntimeError(f"launcher ({self.profile}) did not start: {line!r}")

    def up(self) -> bool:
        """Whether it runs (started here and alive, or attached)."""
        return self._attached or (self._proc is not None and self._proc.poll() is None)

    def connect(self) -> socket.socket:
        with self._lock:
            if not self._attached and (self._proc is None or self._proc.poll() is not None):
                self._start()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        return sock

    def close(self) -> None:
        if self._attached:
            return
        if self._proc is not None and self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self._dir)


_SERVERS: dict[tuple[str, Path], Server] = {}
# in a child of a server: it uses the servers it was told of, and starts none of its own
# (they would end with it)
_CHILD = False


# set by share(): where this checkout's servers are found by every test worker
_SHARED: tuple[Path, int] | None = None


def share(directory: Path, session: int) -> None:
    """Share this checkout's servers with the other workers of the test session: the
    first worker to need one starts it and names its socket in ``directory``, the
    others use it; it ends when process ``session`` (the session's controller) does."""
    global _SHARED
    _SHARED = (directory, session)


def server(profile: str = "full", root: Path = ROOT) -> Server | None:
    """The server of ``profile`` for project ``root`` (None in a child that was not
    told of one)."""
    key = (profile, root)
    if key not in _SERVERS:
        if _CHILD:
            return None
        if root == ROOT and _SHARED is not None:
            _SERVERS[key] = _shared(profile, *_SHARED)
        else:
            _SERVERS[key] = Server(profile, root=root)
    return _SERVERS[key]


def _shared(profile: str, directory: Path, session: int) -> Server:
    """The session's server of ``profile``: started here if no worker has started it."""
    import fcntl

    record = directory / f"launcher-{profile}.socket"
    with open(directory / f"launcher-{profile}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if record.exists():
            return Server(profile, attach=record.read_text())
        started = Server(profile, watch=session)
        started.connect().close()
        record.write_text(started.path)
    return Server(profile, attach=started.path)  # this worker's end does not end it


def close_all() -> None:
    close_copies()  # first: each is a child of this checkout's server
    for srv in _SERVERS.values():
        srv.close()
    _SERVERS.clear()


def close_copies() -> None:
    """End the servers of project copies (each test's own copy: not used again)."""
    for key in [k for k in _SERVERS if k[1] != ROOT]:
        _SERVERS.pop(key).close()
