"""The ``recovery`` entry point: parse, run one subcommand, map errors to exit codes.

``main(argv) -> int`` so tests call it directly; any
:class:`~recovery.errors.RecoveryError` becomes one line on stderr and the
exit code of its class (:mod:`recovery.cli.codes`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from recovery import errors
from recovery.cli import (
    drill,
    importing,
    keys,
    listing,
    plan,
    reading,
    reporting,
    serve,
    sync,
)
from recovery.cli.codes import report
from recovery.version import __version__

COMMAND_GROUPS = (listing, reading, reporting, drill, serve, importing, plan, sync, keys)
"""Each registers its subcommands, in this order in ``recovery --help``."""


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand, each with ``--json``."""
    parser = argparse.ArgumentParser(
        prog="recovery",
        description="Verify, inspect, audit and list signed exact-resume training checkpoints.",
    )
    parser.add_argument("--version", action="version", version=f"recovery {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(sub)
    for action in sub.choices.values():
        action.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``recovery`` subcommand; return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except errors.RecoveryError as err:
        return report(err)


def main_entry() -> None:
    """Console-script wrapper around :func:`main`.

    A reader that stops early (``recovery ls --json | head``) closes the pipe; that
    ends the output quietly, with the exit code the command had reached (no traceback).
    """
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # stdout is gone: point it at devnull so the interpreter's own flush at exit
        # does not raise again (the pattern the Python docs give for SIGPIPE)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    main_entry()
