"""A command run by a launcher server, driven like :class:`subprocess.Popen`; and the
``Popen``/``run`` that choose between it and a fresh interpreter; see :mod:`tests.launcher`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import socket
import subprocess
import time
from typing import Any

from tests.launcher.commands import _HEADER, ROOT, _split, root_for, unsetpriv, unshell
from tests.launcher.servers import _SERVERS, Server, server


def _fd(spec: Any, default: int, opened: list[int]) -> tuple[int, int | None]:
    """(fd to send, our end of a pipe or None) for a Popen-style stream argument."""
    if spec is None:
        return default, None
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd, None
    if spec == subprocess.PIPE:
        r, w = os.pipe()
        ours, theirs = (w, r) if default == 0 else (r, w)
        opened.append(theirs)
        return theirs, ours
    if isinstance(spec, int):
        return spec, None
    return spec.fileno(), None


_SPENT = [0.0]


def cpu_spent() -> float:
    """The CPU seconds of the children this process's :class:`Forked` saw end (with what
    they reaped; a torchrun job's ranks, reaped by its zygote, are not counted): a
    process's launched work, which its own ``getrusage`` does not hold."""
    return _SPENT[0]


class Forked:
    """A child of the launcher, driven like :class:`subprocess.Popen`."""

    def __init__(
        self,
        args: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stdin: Any = None,
        stdout: Any = None,
        stderr: Any = None,
        text: bool = False,
        start_new_session: bool = False,
        rlimits: dict[int, tuple[int, int]] | None = None,
        drop_caps: list[int] | None = None,
        srv: Server | None = None,
        serve: tuple[str, str] | None = None,
    ) -> None:
        """``rlimits``: resource limits the child sets on itself before it runs the
        command (``{resource.RLIMIT_FSIZE: (soft, hard)}``, as a ``preexec_fn`` would);
        ``drop_caps``: capabilities it drops from all its sets (see ``unsetpriv``);
        ``srv``: the server to run it (by default this checkout's ``full`` one);
        ``serve``: instead of ``args``, become the server of a copy of the project
        ``(root, socket)``."""
        srv = srv or server()
        if srv is None:
            raise ValueError(f"launcher: no server to run {args!r}")
        split = ("copy-server", serve[0], [serve[1]]) if serve else _split(list(args))
        if split is None:
            raise ValueError(f"launcher: cannot run {args!r}")
        kind, target, rest = split
        self.args = list(args)
        self.returncode: int | None = None
        self.cpu: float | None = None  # once it ended: its CPU seconds, its reaped children's
        opened: list[int] = []
        try:
            in_fd, in_ours = _fd(stdin, 0, opened)
            out_fd, out_ours = _fd(stdout, 1, opened)
            if stderr == subprocess.STDOUT:
                err_fd, err_ours = out_fd, None
            else:
                err_fd, err_ours = _fd(stderr, 2, opened)
            request = {
                "kind": kind,
                "target": target,
                "args": rest,
                "env": dict(os.environ if env is None else env),
                "cwd": os.path.abspath(cwd) if cwd is not None else os.getcwd(),
                "new_session": start_new_session,
                "rlimits": [[k, *v] for k, v in (rlimits or {}).items()],
                "drop_caps": drop_caps or [],
                "profile": srv.profile,
                "root": str(srv.root),
                "server": srv.path,
                # every server this process has started: the child's own launches use them
                "servers": [[k[0], str(k[1]), v.path] for k, v in _SERVERS.items() if v.up()],
            }
            body = json.dumps(request).encode()
            self._sock = srv.connect()
            socket.send_fds(self._sock, [_HEADER.pack(len(body)) + body], [in_fd, out_fd, err_fd])
        finally:
            for fd in opened:
                os.close(fd)
        mode = "" if text else "b"
        self.stdin = os.fdopen(in_ours, "w" + mode) if in_ours is not None else None
        self.stdout = os.fdopen(out_ours, "r" + mode) if out_ours is not None else None
        self.stderr = os.fdopen(err_ours, "r" + mode) if err_ours is not None else None
        self._buf = b""
        reply = self._message(None)
        if reply is None or "pid" not in reply:
            raise RuntimeError(f"launcher: no pid for {args!r}")
        self.pid: int = reply["pid"]

    def _message(self, timeout: float | None) -> dict[str, Any] | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._sock], [], [], left)
            if not ready:
                return None
            chunk = self._sock.recv(4096)
            if not chunk:
                raise RuntimeError(f"launcher: the server went away while {self.args!r} ran")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _settle(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            msg = self._message(timeout)
            if msg is not None:
                self.returncode = int(msg["status"])
                self.cpu = float(msg["cpu"])
                _SPENT[0] += self.cpu
                self._sock.close()
        return self.returncode

    def poll(self) -> int | None:
        return self._settle(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._settle(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never signal a pid the server has reaped
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        chunks: dict[Any, list[Any]] = {s: [] for s in (self.stdout, self.stderr) if s}
        open_ = list(chunks)
        while open_:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            ready, _, _ = select.select(open_, [], [], left)
            for stream in ready:
                data = os.read(stream.fileno(), 1 << 16)
                if data:
                    chunks[stream].append(data)
                else:
                    open_.remove(stream)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        out = []
        for stream in (self.stdout, self.stderr):
            if stream is None:
                out.append(None)
                continue
            data = b"".join(chunks[stream])
            if "b" not in stream.mode:  # universal newlines, as subprocess's text mode reads
                data = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8").read()
            out.append(data)
            stream.close()
        return out[0], out[1]

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


def _server_for(args: Any, kwargs: dict[str, Any], profile: str) -> Server | None:
    """The server that can run ``args`` with these Popen ``kwargs``, if one can."""
    if isinstance(args, (str, bytes)) or not _plain(kwargs):
        return None
    root = root_for(unsetpriv(list(args))[0], kwargs.get("env"), kwargs.get("cwd"))
    if root is None:
        return None
    srv = server(profile, root)
    if srv is None or root == ROOT:
        return srv
    try:  # a copy's server is started here, so that a copy it cannot preload runs fresh
        srv.connect().close()
    except (RuntimeError, OSError):
        _SERVERS.pop((profile, root), None)
        return None
    return srv


def Popen(args: list[str], **kwargs: Any) -> Any:
    """:class:`Forked` where the launcher can run ``args``, else :class:`subprocess.Popen`
    (``rlimits`` then set by a ``preexec_fn``)."""
    srv = _server_for(args, kwargs, kwargs.pop("profile", "full"))
    if srv is not None:
        argv, caps = unsetpriv(list(args))
        return Forked(argv, srv=srv, drop_caps=caps, **kwargs)
    return subprocess.Popen(args, **_fresh(kwargs))


def _fresh(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for :mod:`subprocess`: ``rlimits`` set by a ``preexec_fn``."""
    limits = kwargs.pop("rlimits", None)
    if limits:
        import resource

        def limit() -> None:
            for which, pair in limits.items():
                resource.setrlimit(which, pair)

        kwargs["preexec_fn"] = limit
    return kwargs


def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """:func:`subprocess.run` for a command, forked by the launcher where it can be."""
    profile = kwargs.pop("profile", "full")
    capture = kwargs.pop("capture_output", False)
    check = kwargs.pop("check", False)
    timeout = kwargs.pop("timeout", None)
    data = kwargs.pop("input", None)
    if capture:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if data is not None:
        kwargs["stdin"] = subprocess.PIPE
    srv = _server_for(args, kwargs, profile)
    if srv is None:
        return subprocess.run(args, input=data, timeout=timeout, check=check, **_fresh(kwargs))
    argv, caps = unsetpriv(list(args))
    with Forked(argv, srv=srv, drop_caps=caps, **kwargs) as proc:
        try:
            out, err = proc.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        done = subprocess.CompletedProcess(proc.args, proc.wait(), out, err)
    if check:
        done.check_returncode()
    return done


def patch(module: Any) -> None:
    """Let ``module`` start its processes through the launcher: its name ``subprocess``
    becomes :mod:`subprocess` with this module's ``Popen`` and ``run`` (the same real
    processes and signals; a command the launcher cannot fork still gets a fresh
    interpreter)."""
    import types

    shim = types.SimpleNamespace(**{k: getattr(subprocess, k) for k in subprocess.__all__})
    shim.Popen = Popen
    shim.run = run
    module.subprocess = shim


def patch_dvc_stages() -> None:
    """Let DVC's stage runner (``dvc repro``, ``dvc exp run``) start a stage's command
    through the launcher where its shell would only have run one plain command."""
    import types

    from dvc.stage import run as stage_run

    shim = types.SimpleNamespace(**{k: getattr(subprocess, k) for k in subprocess.__all__})

    def popen(args: Any, **kwargs: Any) -> Any:
        argv = unshell(args, kwargs.get("env"))
        if argv is not None and _server_for(argv, dict(kwargs), "full") is not None:
            return Popen(argv, **kwargs)
        return subprocess.Popen(args, **kwargs)

    shim.Popen = popen
    stage_run.subprocess = shim  # type: ignore[attr-defined]


def patch_drills() -> None:
    """Let :mod:`recovery.tools.drill.runs` start its runs through the launcher."""
    from recovery.tools.drill import runs as drill_runs

    patch(drill_runs)


_KNOWN = {"env", "cwd", "stdin", "stdout", "stderr", "text", "start_new_session", "rlimits"}


def _plain(kwargs: dict[str, Any]) -> bool:
    """Only the Popen arguments the launcher honours (anything else: a real subprocess).
    ``close_fds=True`` and ``shell=False`` are Popen's defaults, which a child has."""
    if "universal_newlines" in kwargs:
        kwargs["text"] = kwargs.pop("universal_newlines")
    for name, default in (("close_fds", True), ("shell", False)):
        if name in kwargs and kwargs[name] == default:
            del kwargs[name]
    return set(kwargs) <= _KNOWN
