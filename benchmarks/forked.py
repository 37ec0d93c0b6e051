"""Fresh child processes for a benchmark's measurements, without paying the imports each time.

A measurement that must not see the benchmark's own memory (a load, timed as a resuming
process does it, in memory no earlier load warmed; a peak RSS) runs in a child process.
Started as a fresh interpreter, each child imported torch, safetensors and the package
again (about 2 s, seven times a run of ``bench_checkpoint.py``) before its timed call.
Instead, one *helper*, a fresh interpreter of the benchmark script started once, imports
the script's modules, allocates nothing, starts no thread, and forks a child for each
measurement: each child is a process of its own, whose memory is the helper's (the
imports only), never the benchmark's, and it ends after its one measurement. Only the
timed call's number comes back, so what a child measures is what a fresh interpreter
would measure after its imports.

The script runs :func:`serve` when started with :data:`HELPER_FLAG`; the benchmark
process asks through :class:`Helper`.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

HELPER_FLAG = "--forking-helper"


def serve(measure: Callable[[list[str]], float], preload: tuple[str, ...] = ()) -> None:
    """The helper's loop: import ``preload`` (modules the measurements import lazily,
    outside what they time); then for each JSON argument list read from stdin, fork a
    child that prints nothing on stdout and returns ``measure(args)``, and answer one
    JSON line ``{"status": exit status, "value": the number or null}``. At the end of
    input the helper exits at once (it holds nothing to flush or release)."""
    for name in preload:
        importlib.import_module(name)
    for line in sys.stdin:
        args = json.loads(line)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one measurement, then out, without the helper's exit path
            code = 1
            try:
                os.close(read_end)
                os.dup2(2, 1)  # the answers' channel is the helper's stdout: keep it clean
                value = measure(args)
                os.write(write_end, repr(float(value)).encode())
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as answer:
            data = answer.read()
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        value = float(data) if code == 0 and data else None
        print(json.dumps({"status": code, "value": value}), flush=True)
    os._exit(0)


class Helper:
    """The benchmark's side: a helper of ``script`` started on first use, ended by
    :meth:`close` (or when this process exits and its stdin closes)."""

    def __init__(self, script: str | Path) -> None:
        self.script = str(script)
        self._proc: subprocess.Popen[str] | None = None

    def measure(self, args: list[str]) -> float:
        """What ``measure(args)`` returns in a freshly forked child of the helper."""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, self.script, HELPER_FLAG],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(args) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the benchmark's helper ended (status {self._proc.wait()})")
        answer = json.loads(line)
        if answer["status"] != 0 or answer["value"] is None:
            raise RuntimeError(f"child {args} failed with status {answer['status']}")
        return float(answer["value"])

    def close(self) -> None:
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait()
            self._proc = None
