"""The launcher's server (run as ``python tests/launcher/server.py SOCKET PROFILE`` by
:class:`tests.launcher.Server`): preload a profile, then fork a child per request and run
the request's command in it as ``__main__``; see :mod:`tests.launcher`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import selectors
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

# the client half, for its constants and for a child's own launches (a drill's runs)
_BASE_PATH = [p for p in sys.path[1:] if p != str(Path(__file__).parent)]
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests import launcher as client  # noqa: E402
from tests.launcher import servers as registry  # noqa: E402
from tests.launcher import startup  # noqa: E402

sys.path.pop(0)
CORE_ABSENT, PROFILES, ROOT, TORCHRUN, _HEADER = (
    client.CORE_ABSENT,
    client.PROFILES,
    client.ROOT,
    client.TORCHRUN,
    client._HEADER,
)


def _preload(profile: str, root: Path) -> None:
    """Import ``profile``'s modules, the project's packages from ``root`` (this checkout
    or a copy of the project; a package the copy lacks comes from where it is installed,
    as in a fresh interpreter, and ``recipes``, installed nowhere, is then left out)."""
    import importlib

    startup.track_elastic_loggers()
    sys.path.insert(1, str(root))  # the recipes package beside train.py
    for name in PROFILES[profile]:
        if name.split(".")[0] == "recipes" and not (root / "recipes").is_dir():
            continue
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
    sys.path.remove(str(root))
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


def _serve(path: str, ready: int = 1, watch: int | None = None) -> dict[str, Any]:
    """Accept requests until stdin closes (with ``watch``: until that process ends);
    fork a child per request. Returns only in a child (its request); the server itself
    leaves through ``SystemExit``, killing its children. ``ready``: the file descriptor
    told ``ready`` once requests are accepted."""
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
    if watch is None:
        sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
    children: dict[int, socket.socket] = {}
    os.write(ready, b"ready\n")
    while True:
        events = sel.select(timeout=None if watch is None else 1.0)
        if watch is not None and not _alive(watch):
            _end(children)
        for key, _ in events:
            if key.data == "stdin":
                _end(children)
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


def _end(children: dict[int, socket.socket]) -> None:
    """The test session is gone: so is every child, and the server."""
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    raise SystemExit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            code = os.waitstatus_to_exitcode(status)
            # its CPU seconds, with those of the children it reaped (a cost to measure)
            reply = {"status": code, "cpu": usage.ru_utime + usage.ru_stime}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(reply).encode() + b"\n")
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
    startup.limit(request)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _stdio(bool(os.environ.get("PYTHONUNBUFFERED")))
    startup.apply_environment()
    random.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    kind, target, args = request["kind"], request["target"], request["args"]
    if kind == "copy-server":
        _serve_a_copy(Path(target), args[0], base_path)  # never returns
    first = {
        "script": lambda: os.path.dirname(os.path.realpath(target)),
        "code": lambda: "",
        "module": os.getcwd,
    }[kind]()
    sys.path[:] = [first, *(os.path.abspath(p) for p in extra), *base_path]
    registry._CHILD = True
    root = Path(request["root"])
    if request["profile"] == "full":  # a drill run here forks its runs from this server too,
        # and a DVC stage command run here (dvc repro) its command
        for profile, home, path in request["servers"]:
            client._SERVERS[(profile, Path(home))] = client.Server(
                profile, attach=path, root=Path(home)
            )
        client._SERVERS[("full", root)] = client.Server("full", attach=request["server"], root=root)
        client.patch_drills()
        client.patch_dvc_stages()
    if kind == "module" and target == TORCHRUN:
        _ranks_from_a_zygote(base_path, root)
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


def _serve_a_copy(root: Path, path: str, base_path: list[str]) -> None:
    """Become the server of the project copy at ``root``: the project's packages imported
    again from the copy (what else the profile preloads, this process holds already),
    then serve on ``path`` until standard input closes."""
    for name in [m for m in sys.modules if m.split(".")[0] in client.OWN_PACKAGES]:
        del sys.modules[name]
    sys.path[:] = base_path
    _preload("full", root)
    try:
        request = _serve(path)
    except SystemExit:
        _finalize(0)
    _execute(request, base_path)  # a command for the copy: never returns


def _ranks_from_a_zygote(base_path: list[str], root: Path) -> None:
    """In a torchrun agent, before it starts a thread: fork a *zygote*, a launcher server
    of the agent's own (its child, so the job's process tree holds the ranks, and a kill
    of the tree reaches them), and let the agent start its ranks as that server's
    children: the same commands, environments and signals, without a fresh interpreter's
    imports. The zygote ends, killing any rank still running, when the agent is gone."""
    import tempfile

    from torch.distributed.elastic.multiprocessing.subprocess_handler import (
        subprocess_handler as handler,
    )

    path = os.path.join(tempfile.mkdtemp(prefix="launcher-ranks-"), "sock")
    alive_r, alive_w = os.pipe()  # the agent holds alive_w open until it exits
    ready_r, ready_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:
        os.close(alive_w)
        os.close(ready_r)
        os.dup2(alive_r, 0)
        quiet = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):  # the job's output is the ranks' own, not held open by the zygote
            os.dup2(quiet, fd)
        os.close(quiet)
        try:
            request = _serve(path, ready=ready_w)
        except SystemExit:
            os._exit(0)
        os.close(ready_w)
        _execute(request, base_path)  # a rank: never returns
    os.close(alive_r)
    os.close(ready_w)
    with os.fdopen(ready_r) as ready:
        if ready.readline().strip() != "ready":
            raise RuntimeError("launcher: the ranks' zygote did not start")
    zygote = client.Server("ranks", attach=path, root=root)
    fresh = handler.SubprocessHandler._popen

    def popen(self: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
        cmd = list(args)
        if cmd[:2] == [sys.executable, "-u"]:  # python -u script: unbuffered, as applied
            cmd, env = [cmd[0], *cmd[2:]], {**env, "PYTHONUNBUFFERED": "1"}
        if client.root_for(cmd, env) != root:
            return fresh(self, args, env)
        out, err = self._stdout, self._stderr
        return client.Forked(
            cmd, env=env, stdout=out, stderr=err, start_new_session=True, srv=zygote
        )

    handler.SubprocessHandler._popen = popen


def _execute(request: dict[str, Any], base_path: list[str]) -> None:
    """Run ``request`` in this forked child and exit as a fresh interpreter would."""
    code = 0
    try:
        _run(request, base_path)
    except SystemExit as done:
        code = _exit_code(done.code)
    except BaseException as err:  # as a fresh interpreter reports it: the script's frames only
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        # the script's own hook, if it installed one (the default prints __traceback__)
        sys.excepthook(type(err), err.with_traceback(tb), tb)
        code = -signal.SIGINT if isinstance(err, KeyboardInterrupt) else 1
    _finalize(code)


def _server_main(path: str, profile: str, root: Path, watch: int | None) -> None:
    _preload(profile, root)
    _execute(_serve(path, watch=watch), _BASE_PATH)


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


if __name__ == "__main__":
    _server_main(
        sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]) if sys.argv[4:] else None
    )
