"""The CLI's exit codes (:mod:`recovery.exitcodes`) and its report of an error: one line on
stderr, and under ``--json`` the same as a JSON object on stdout (:func:`error_json`)."""

from __future__ import annotations

import json
import sys
from typing import Any

from recovery import errors
from recovery.exitcodes import EXIT_CODES, exit_code

__all__ = ["EXIT_CODES", "error_json", "exit_code", "of_error", "print_error_json", "report"]


def report(err: BaseException) -> int:
    """Print one line for ``err`` on stderr and return its exit code."""
    label = "preempted" if isinstance(err, errors.Preempted) else "error"
    print(f"{label}: {err}", file=sys.stderr)
    return exit_code(err)


def error_json(code: int, name: str, message: str, path: object = None) -> dict[str, Any]:
    """``{"error": {"code", "name", "message"[, "path"]}}``: what a command run with
    ``--json`` prints on stdout when it fails (``name``: the error's class, or ``usage``)."""
    body: dict[str, Any] = {"code": code, "name": name, "message": message}
    if path is not None:
        body["path"] = str(path)
    return {"error": body}


def of_error(err: BaseException) -> dict[str, Any]:
    """:func:`error_json` of a raised error (its class name, its exit code)."""
    return error_json(exit_code(err), type(err).__name__, str(err), getattr(err, "path", None))


def print_error_json(err: BaseException) -> None:
    """Print :func:`of_error` of ``err`` on stdout, one JSON object."""
    print(json.dumps(of_error(err), indent=1, sort_keys=True))
