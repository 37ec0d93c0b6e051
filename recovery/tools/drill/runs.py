"""One run of a drilled program, killed at a point or let finish, and the series of
victims: what both drills (:mod:`recovery.tools.drill`, the project's ``train.py``;
:mod:`recovery.tools.drill.command`, any command) run.

How a drill knows its victim is at the point: the process is started with
``RECOVERY_PAUSE_AT=<point>`` and ``RECOVERY_PAUSE_MARK=<file>``
(:mod:`recovery.faults`); the library, on reaching the point, writes the file and
sleeps; the drill sees the file and sends SIGKILL. Nothing is timed: the kill lands
exactly there, whatever the machine's speed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery import faults
from recovery.errors import RecoveryError
from recovery.tools import killpoints

LOG_FILE = "drill.log"
STDERR_FILE = "stderr.log"
TAIL_LINES = 15


@dataclass(frozen=True)
class Ran:
    """One run: its exit status (negative: the signal that ended it), the point it was
    killed at (``""``: it ended by itself), and the end of its stderr."""

    code: int
    hit: str
    tail: str


def launch(
    cmd: Sequence[str],
    *,
    env: dict[str, str],
    root: Path,
    pause_at: str | None,
    timeout_s: float | None = None,
    own_stderr: bool = False,
    group: bool = False,
    what: str = "the run",
) -> Ran:
    """Run ``cmd`` once, its output appended to ``root/drill.log``; with ``pause_at``,
    SIGKILL it when it reaches that point.

    ``own_stderr``: stderr goes to ``root/stderr.log`` instead (so :attr:`Ran.tail` is
    the program's own complaint, not its progress output). ``group``: the program runs
    in a session of its own and the kill (or a timeout, or the drill's own interruption)
    reaches every process in it: a wrapper script, torchrun's ranks, loader workers.

    Raises:
        RecoveryError: it ran longer than ``timeout_s`` (it is killed first), naming ``what``.
    """
    mark = root / "paused.mark"
    mark.unlink(missing_ok=True)
    env = dict(env)
    if pause_at:
        env[faults.PAUSE_ENV] = pause_at
        env[faults.MARK_ENV] = str(mark)
    root.mkdir(parents=True, exist_ok=True)
    err_path = root / (STDERR_FILE if own_stderr else LOG_FILE)
    start = err_path.stat().st_size if err_path.exists() else 0
    deadline = time.monotonic() + timeout_s if timeout_s is not None else None
    with contextlib.ExitStack() as files:
        out = files.enter_context(open(root / LOG_FILE, "a"))
        err = files.enter_context(open(err_path, "a")) if own_stderr else subprocess.STDOUT
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=group)
        hit = ""
        try:
            while proc.poll() is None:
                if pause_at and mark.exists():
                    hit = pause_at
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise RecoveryError(
                        f"drill: {what} did not finish within {timeout_s:g}s and was killed "
                        f"(raise --timeout if it needs longer; its output: {root / LOG_FILE})"
                        + _tail_text(_tail(err_path, start))
                    )
                time.sleep(0.02)
        finally:
            # killed at its point, timed out or the drill itself interrupted: never leave
            # a process behind that would go on writing the run directory
            if proc.poll() is None:
                _kill(proc, group=group)
    return Ran(proc.returncode, hit, _tail(err_path, start))


def victims(
    points: Sequence[str],
    run: Callable[[killpoints.Kill], Ran],
    failed: Callable[[str, Ran], Exception],
    ended: Callable[[str, Ran], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the victim once per point, in order (``run`` starts it armed at the point): the
    kill log. A run that ends by itself before its point stops the series (its later
    points cannot come either): a clean end is left to the verdict (never reached),
    a failure raises ``failed(point, ran)``. ``ended(point, ran)`` hears of each run
    as it ends (the drill's progress line).
    """
    log_: list[dict[str, Any]] = []
    for point in points:
        ran = run(killpoints.parse(point))
        log_.append({"point": point, "reached": bool(ran.hit), "exit": ran.code})
        if ended is not None:
            ended(point, ran)
        if not ran.hit:
            if ran.code != 0:
                raise failed(point, ran)
            break
    return log_


def never_reached(kills: list[dict[str, Any]]) -> list[str]:
    """The verdict's line for kill points the victim never reached (none: empty)."""
    missed = [k["point"] for k in kills if not k["reached"]]
    return [f"kill points never reached: {missed}"] if missed else []


def _kill(proc: subprocess.Popen[bytes], *, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(path: Path, start: int) -> str:
    """The last lines ``path`` gained since it was ``start`` bytes long."""
    if not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(start)
        text = fh.read().decode("utf-8", errors="replace")
    return "\n".join(text.rstrip().splitlines()[-TAIL_LINES:])


def _tail_text(tail: str) -> str:
    return "; its stderr ends:\n  " + tail.replace("\n", "\n  ") if tail else ""


def exit_text(code: int) -> str:
    """``exit 3``, or ``killed by SIGSEGV`` for a negative status."""
    if code >= 0:
        return f"exit {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def failure(what: str, ran: Ran, root: Path) -> RecoveryError:
    """The error for a program that failed by itself (``launch`` with ``own_stderr`` in
    ``root``): its status and the end of its stderr."""
    return RecoveryError(
        f"drill: {what} failed ({exit_text(ran.code)}; the drill did not kill this run; "
        f"its output: {root / LOG_FILE}, {root / STDERR_FILE}){_tail_text(ran.tail)}"
    )
