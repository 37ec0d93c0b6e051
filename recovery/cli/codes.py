"""The CLI's exit codes (:mod:`recovery.exitcodes`) and its one-line report of an error."""

from __future__ import annotations

import sys

from recovery import errors
from recovery.exitcodes import EXIT_CODES, exit_code

__all__ = ["EXIT_CODES", "exit_code", "report"]


def report(err: BaseException) -> int:
    """Print one line for ``err`` on stderr and return its exit code."""
    label = "preempted" if isinstance(err, errors.Preempted) else "error"
    print(f"{label}: {err}", file=sys.stderr)
    return exit_code(err)
