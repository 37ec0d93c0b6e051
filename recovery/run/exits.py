"""How a library error that ends a run ends the process: one line and the README's exit code.

The checkpointer as a context manager, and :meth:`Checkpointer.exit_on_error
<recovery.run.checkpointer.Checkpointer.exit_on_error>` for a loop without a
with-block, end the process as ``recovery`` and ``train.py`` do: one line on stderr
and the exit code of :mod:`recovery.exitcodes` (:class:`~recovery.errors.Preempted`:
``checkpoint.preempt_exit_code``, 75 by default, "checkpointed, requeue me"), so an
own loop needs no ``try``.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable
from types import TracebackType

from recovery.errors import Preempted, RecoveryError
from recovery.exitcodes import exit_code

log = logging.getLogger(__name__)


def one_line(message: str) -> str:
    """A message of several lines as one: an indented line is an item of the list the line
    before it opened (``...:``), joined with ``; ``; another line is a sentence of its own."""
    out = ""
    for raw in message.splitlines():
        line = raw.strip()
        if not line:
            continue
        if not out:
            out = line
        elif raw[:1].isspace():
            out += (" " if out.endswith(":") else "; ") + line
        else:
            out += (" " if out.endswith((".", ":")) else ". ") + line
    return out


def report(err: RecoveryError) -> int:
    """Log ``err`` as the CLI prints it (one line) and return its exit code."""
    code = exit_code(err)
    if isinstance(err, Preempted):
        log.warning("%s", err)
    else:
        log.error("error: %s (exit %d)", one_line(str(err)) or type(err).__name__, code)
    return code


def install_hook(close: Callable[[], None], requeue: Callable[[BaseException], object]) -> None:
    """From now on an uncaught library error calls ``close``, prints one line, calls
    ``requeue`` with it and ends the process with its exit code; other exceptions keep
    Python's own handling. Only on the main thread (elsewhere: one warning, nothing).
    """
    previous = sys.excepthook

    def hook(kind: type[BaseException], err: BaseException, tb: TracebackType | None) -> None:
        if not isinstance(err, RecoveryError):
            previous(kind, err, tb)
            return
        try:
            close()
        except RecoveryError as failed:
            log.error("while closing: %s", failed)
        code = report(err)
        requeue(err)
        atexit._run_exitfuncs()  # what the interpreter's own exit would still run
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)  # an excepthook cannot choose the exit status otherwise

    if threading.current_thread() is not threading.main_thread():
        log.warning("exit_on_error: not on the main thread; errors propagate as raised")
        return
    sys.excepthook = hook
