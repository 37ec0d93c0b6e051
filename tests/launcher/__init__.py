"""A preloaded launcher: real child processes without paying the imports again.

Most of the suite's time went into fresh interpreters importing torch, Hydra, DVC and
the package (about 2.3 s each) before a test's process did anything. This module starts
one *server* per profile and test session, a fresh interpreter that imports those
modules once, computes nothing (no torch thread pool is started) and then forks a
child for each command it is sent. The child is a real process of its own:

- it has its own pid, which the test signals directly (a real SIGKILL, a real SIGTERM);
- it runs the command's script, ``-c`` code, module or console script as ``__main__``
  with the command's argv, environment (``PYTHONPATH`` included), working directory
  and standard streams (the test's own file descriptors, passed over the socket);
- it ends through the interpreter's ordinary shutdown (atexit handlers, non-daemon
  threads joined, buffers flushed), so its exit status is the one a fresh interpreter
  would give: the script's ``sys.exit`` code, 1 for an uncaught exception, or minus
  the signal that killed it. The server reaps it and sends that status back.

What a fork cannot give, and so what keeps a fresh interpreter (``subprocess``
directly): import hygiene (what importing a module pulls in), a fresh install, a
``torchrun`` job (agent and ranks), and environment variables read when
a library is first imported (``OMP_NUM_THREADS`` and the like) — :func:`forkable`
refuses a command that sets one of those. Stochastic state that a fresh interpreter
seeds from the OS (Python's ``random``, NumPy's global generator) is reseeded in each
child; torch's default generator starts from its fixed default seed either way.

Profiles: ``full`` preloads what ``train.py``, the CLI, DVC and the recipes import;
``core`` preloads only torch and the package's core, for tests that prove a script
runs without the optional dependencies (those must stay importable-as-absent).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("server.py")
PROFILES: dict[str, tuple[str, ...]] = {
    "core": ("torch", "torch._dynamo", "numpy", "safetensors", "yaml", "recovery"),
    "full": (
        "torch",
        "torch._dynamo",  # imported by the first optimizer a process builds: 1.7 s
        "numpy",
        "safetensors",
        "yaml",
        "recovery",
        "recovery.cli.main",
        "hydra",
        "hydra.main",
        "hydra._internal.utils",
        "hydra._internal.hydra",
        "hydra.core.utils",
        "omegaconf",
        "dvc.repo",
        "dvc.api",
        "dvc.cli",
        "sklearn.datasets",
        "matplotlib.pyplot",
        "model_signing",
        "recipes",
        # what reading or writing a torch.export program imports on first use (networkx,
        # sympy, functorch, inductor: about 3 s a process that exports or serves)
        "torch.export._trace",
        "torch.export.pt2_archive._package",
        "torch._export.serde.serialize",
        "torch._functorch.aot_autograd",
        "torch._functorch.partitioners",
        "torch._inductor.codecache",
    ),
}
# what "core" must not hold, so a script's own finder can still make them absent
CORE_ABSENT = ("dvc", "hydra", "omegaconf", "matplotlib", "sklearn")
# read by a library as it is first imported: a child of the server would not see them
# (PYTHONPATH and PYTHONUNBUFFERED the child applies itself; every other PYTHON* counts)
IMPORT_TIME_ENV = ("PYTHON", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "LD_", "TORCH_", "CUDA_")
IMPORT_TIME_ENV += ("GIT_PYTHON_", "TQDM_", "MPLBACKEND", "MALLOC_", "LOGLEVEL")
APPLIED_ENV = ("PYTHONPATH", "PYTHONUNBUFFERED")
_BASE_ENV = dict(os.environ)
# this checkout's packages the server holds: a command that would import another copy
# of one of them is not forkable
OWN_PACKAGES = ("recovery", "recipes")
_HEADER = struct.Struct("!I")


def _split(cmd: list[str]) -> tuple[str, str, list[str]] | None:
    """``(kind, target, args)`` of a command the server can run, or None."""
    if not cmd:
        return None
    exe = os.path.realpath(cmd[0]) if os.sep in cmd[0] else None
    if exe is None:
        return None
    if cmd[0] == sys.executable or exe == os.path.realpath(sys.executable):
        rest = cmd[1:]
        if not rest or (rest[0].startswith("-") and rest[0] not in ("-c", "-m")):
            return None  # interpreter flags: not what the server runs
        if rest[0] == "-c" and len(rest) > 1:
            return "code", rest[1], rest[2:]
        if rest[0] == "-m" and len(rest) > 1:
            # torchrun (agent and ranks) and torch's own tools: fresh interpreters
            if rest[1].split(".")[0] == "torch":
                return None
            return "module", rest[1], rest[2:]
        if rest[0].endswith(".py"):
            return "script", rest[0], rest[1:]
        return None
    # a console script of this interpreter (recovery, dvc, model_signing)
    try:
        with open(cmd[0], "rb") as fh:
            shebang = fh.readline().strip()
    except OSError:
        return None
    if shebang == b"#!" + sys.executable.encode():
        return "script", cmd[0], cmd[1:]
    return None


def forkable(
    cmd: list[str], env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
) -> bool:
    """Whether the launcher can run ``cmd`` as a fresh interpreter would: one of the forms
    :func:`_split` knows, no variable read at import time changed, and no other copy of a
    preloaded package of this checkout where the command would import it from (a copy
    of the project runs its own code)."""
    split = _split(list(cmd))
    if split is None:
        return False
    if env is None:
        env = dict(os.environ)
    changed = {k for k, v in env.items() if _BASE_ENV.get(k) != v}
    changed |= {k for k in _BASE_ENV if k not in env}
    if any(k.startswith(IMPORT_TIME_ENV) and k not in APPLIED_ENV for k in changed):
        return False
    kind, target, _ = split
    here = os.path.abspath(cwd if cwd is not None else os.getcwd())
    first = os.path.dirname(os.path.realpath(os.path.join(here, target)))
    entries = [first if kind == "script" else here]
    entries += [os.path.join(here, p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    for entry in entries:
        for name in OWN_PACKAGES:
            copy = os.path.join(entry, name)
            package = os.path.isdir(copy) or os.path.exists(copy + ".py")
            if package and os.path.realpath(copy) != str(ROOT / name):
                return False
    return True


class Server:
    """One preloaded server process (started on first use)."""

    def __init__(self, profile: str, *, attach: str | None = None) -> None:
        """``attach``: the socket of a running server (in one of its children)."""
        self.profile = profile
        self._proc: subprocess.Popen[str] | None = None
        self._attached = attach is not None
        self._dir = os.path.dirname(attach) if attach else tempfile.mkdtemp(prefix="launcher-")
        self.path = attach or os.path.join(self._dir, "sock")
        self._lock = threading.Lock()

    def _start(self) -> None:
        env = {k: v for k, v in _BASE_ENV.items() if k not in APPLIED_ENV}
        self._proc = subprocess.Popen(
            [sys.executable, str(SERVER), self.path, self.profile],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=self._dir,
        )
        line = self._proc.stdout.readline() if self._proc.stdout else ""
        if line.strip() != "ready":
            self._proc.wait()
            raise RuntimeError(f"launcher ({self.profile}) did not start: {line!r}")

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


_SERVERS: dict[str, Server] = {}


def server(profile: str = "full") -> Server:
    if profile not in _SERVERS:
        _SERVERS[profile] = Server(profile)
    return _SERVERS[profile]


def close_all() -> None:
    for srv in _SERVERS.values():
        srv.close()
    _SERVERS.clear()


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
        profile: str = "full",
    ) -> None:
        split = _split(list(args))
        if split is None:
            raise ValueError(f"launcher: cannot run {args!r}")
        kind, target, rest = split
        self.args = list(args)
        self.returncode: int | None = None
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
                "profile": profile,
            }
            srv = server(profile)
            request["server"] = srv.path
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


def Popen(args: list[str], **kwargs: Any) -> Any:
    """:class:`Forked` where the launcher can run ``args``, else :class:`subprocess.Popen`."""
    profile = kwargs.pop("profile", "full")
    if forkable(list(args), kwargs.get("env"), kwargs.get("cwd")) and _plain(kwargs):
        return Forked(list(args), profile=profile, **kwargs)
    return subprocess.Popen(args, **kwargs)


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
    if not (forkable(list(args), kwargs.get("env"), kwargs.get("cwd")) and _plain(kwargs)):
        return subprocess.run(args, input=data, timeout=timeout, check=check, **kwargs)
    with Forked(list(args), profile=profile, **kwargs) as proc:
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


def patch_drills() -> None:
    """Let :mod:`recovery.tools.drill.runs` start its runs through the launcher."""
    from recovery.tools.drill import runs as drill_runs

    patch(drill_runs)


_KNOWN = {"env", "cwd", "stdin", "stdout", "stderr", "text", "start_new_session"}


def _plain(kwargs: dict[str, Any]) -> bool:
    """Only the Popen arguments the launcher honours (anything else: a real subprocess)."""
    if "universal_newlines" in kwargs:
        kwargs["text"] = kwargs.pop("universal_newlines")
    return set(kwargs) <= _KNOWN
