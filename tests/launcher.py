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
import selectors
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

ROOT = Path(__file__).resolve().parents[1]
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


# ---------------------------------------------------------------- the server side


def _preload(profile: str) -> None:
    import importlib

    sys.path.insert(1, str(ROOT))  # the recipes package beside train.py
    for name in PROFILES[profile]:
        importlib.import_module(name)
    if profile == "full":
        import pkgutil

        import recovery

        for info in pkgutil.walk_packages(recovery.__path__, "recovery."):
            importlib.import_module(info.name)
    else:
        loaded = sorted({m.split(".")[0] for m in sys.modules} & set(CORE_ABSENT))
        if loaded:
            raise SystemExit(f"launcher: the core profile imported {loaded}")
    sys.path.remove(str(ROOT))
    import gc

    gc.collect()
    gc.freeze()  # what the preload made is never collected: a child's collection skips it


def _recv_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise EOFError("launcher: request cut short")
        data += more
    (size,) = _HEADER.unpack_from(data)
    return json.loads(data[_HEADER.size : _HEADER.size + size]), list(fds)


def _serve(path: str) -> dict[str, Any]:
    """Accept requests until stdin closes; fork a child per request. Returns only in a
    child (its request); the server itself leaves through ``SystemExit``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            if key.data == "stdin":  # the test session is gone: so is every child
                for pid in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                raise SystemExit(0)
            if key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                _reap(children)
                continue
            conn, _ = listener.accept()
            try:
                request, fds = _recv_request(conn)
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sel.close()
                for sock in (listener, conn, *children.values()):
                    sock.close()
                os.close(wake_r)
                os.close(wake_w)
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                for fd in set(fds):
                    if fd > 2:
                        os.close(fd)
                return request
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            _reap(children)  # a child may have ended before its conn was registered


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"status": code}).encode() + b"\n")
            conn.close()


def _stdio(unbuffered: bool) -> None:
    """Standard streams over fds 0-2 as a fresh interpreter makes them."""

    def writer(fd: int, errors: str) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        tty = raw.isatty()
        stream = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            stream,  # type: ignore[arg-type]
            encoding="utf-8",
            errors=errors,
            line_buffering=tty,
            write_through=unbuffered,
        )

    reader = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), "utf-8")
    sys.stdin = sys.__stdin__ = reader
    sys.stdout = sys.__stdout__ = writer(1, "strict")
    sys.stderr = sys.__stderr__ = writer(2, "backslashreplace")


def _run(request: dict[str, Any], base_path: list[str]) -> None:
    """Run the request as ``__main__`` in this (forked) process."""
    import random
    import runpy
    import types

    if request["new_session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _stdio(bool(os.environ.get("PYTHONUNBUFFERED")))
    random.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    kind, target, args = request["kind"], request["target"], request["args"]
    first = {
        "script": lambda: os.path.dirname(os.path.realpath(target)),
        "code": lambda: "",
        "module": os.getcwd,
    }[kind]()
    sys.path[:] = [first, *(os.path.abspath(p) for p in extra), *base_path]
    if request["profile"] == "full":  # a drill run here forks its runs from this server too
        _SERVERS["full"] = Server("full", attach=request["server"])
        patch_drills()
    if kind == "script":
        sys.argv = [target, *args]
        runpy.run_path(target, run_name="__main__")
    elif kind == "module":
        sys.argv = ["-m", *args]
        sys.modules.pop(target, None)  # run as __main__ only, as `python -m` does
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *args]
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = main
        exec(compile(target, "<string>", "exec"), main.__dict__)


def _server_main(path: str, profile: str) -> None:
    base_path = [p for p in sys.path[1:] if p != str(Path(__file__).parent)]
    _preload(profile)
    request = _serve(path)
    code = 0
    try:
        _run(request, base_path)
    except SystemExit as done:
        code = _exit_code(done.code)
    except BaseException as err:  # as a fresh interpreter reports it: the script's frames only
        import traceback

        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        traceback.print_exception(type(err), err, tb)
        code = -signal.SIGINT if isinstance(err, KeyboardInterrupt) else 1
    _finalize(code)


def _exit_code(code: object) -> int:
    """What the interpreter exits with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finalize(code: int) -> None:
    """The interpreter's shutdown up to (not including) tearing its modules down, which
    with torch, DVC and Hydra loaded takes over a second and changes nothing outside:
    non-daemon threads joined, atexit handlers run, garbage (open files) collected and
    flushed, the standard streams flushed; then exit with ``code``."""
    import atexit
    import gc

    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code == -signal.SIGINT:  # Python ends by the signal itself after a KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


# ---------------------------------------------------------------- the client side


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
            [sys.executable, __file__, self.path, self.profile],
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


def patch_drills() -> None:
    """Let :mod:`recovery.tools.drill_runs` start its runs through the launcher: the same
    real processes and SIGKILLs (commands it cannot fork still get a fresh interpreter)."""
    import types

    from recovery.tools import drill_runs

    shim = types.SimpleNamespace(**{k: getattr(subprocess, k) for k in subprocess.__all__})
    shim.Popen = Popen
    shim.run = run
    drill_runs.subprocess = shim  # type: ignore[assignment]


_KNOWN = {"env", "cwd", "stdin", "stdout", "stderr", "text", "start_new_session"}


def _plain(kwargs: dict[str, Any]) -> bool:
    """Only the Popen arguments the launcher honours (anything else: a real subprocess)."""
    if "universal_newlines" in kwargs:
        kwargs["text"] = kwargs.pop("universal_newlines")
    return set(kwargs) <= _KNOWN


if __name__ == "__main__":
    _server_main(sys.argv[1], sys.argv[2])
