"""The ``recovery`` entry point: parse, run one subcommand, map errors to exit codes.

``main(argv) -> int`` so tests call it directly; any
:class:`~recovery.errors.RecoveryError` becomes one line on stderr and the
exit code of its class (:mod:`recovery.cli.codes`), and under ``--json`` also a
JSON object on stdout (``{"error": {"code", "name", "message"}}``).

It answers at once: only the module of the subcommand that runs is imported
(:mod:`recovery.cli.helptext` lists every subcommand's module and summary), so
``recovery --help`` and ``--version`` import no command, and a command imports torch
only when it needs tensors.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Collection, Sequence
from typing import NoReturn

from recovery import access, errors
from recovery.cli import helptext
from recovery.cli.codes import error_json, print_error_json, report
from recovery.version import __version__


class Parser(argparse.ArgumentParser):
    """argparse's parser; :class:`JsonParser`'s refusals are also a JSON object on stdout."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if self.json_errors:
            what = f"{self.prog}: {message}"
            print(json.dumps(error_json(helptext.USAGE, "usage", what), indent=1, sort_keys=True))
            self.exit(helptext.USAGE, f"{what}\n")
        super().error(message)


class JsonParser(Parser):
    """The parser of a command line that holds ``--json``."""

    json_errors = True


def build_parser(
    commands: Collection[str] | None = None, *, json_errors: bool = False
) -> argparse.ArgumentParser:
    """Every subcommand, each with ``--json``, its examples and its exit codes.

    Args:
        commands: the subcommands whose arguments to register (importing their
            modules); the others are only their line in ``recovery --help``. ``None``: all.
        json_errors: a bad command line is a JSON object on stdout (``--json`` was given).
    """
    parser = (JsonParser if json_errors else Parser)(
        prog="recovery",
        description="Verify, inspect, audit and list signed exact-resume training checkpoints.",
        epilog=helptext.all_codes(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"recovery {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=type(parser))
    wanted = helptext.COMMANDS if commands is None else commands
    for name, command in helptext.COMMANDS.items():
        if name in wanted and name not in sub.choices:  # a module may register several
            importlib.import_module(f"recovery.cli.commands.{command.module}").register(sub)
    for name, command in helptext.COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=command.summary)
    for action in sub.choices.values():
        action.add_argument("--json", action="store_true", help="print JSON instead of text")
    helptext.apply(sub)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the top-level
    parser's options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``recovery`` subcommand; return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ours = argv[: argv.index("--")] if "--" in argv else argv  # past "--": a drilled command's
    as_json = "--json" in ours
    name = command_of(ours)
    parser = build_parser([name] if name in helptext.COMMANDS else [], json_errors=as_json)
    args = parser.parse_args(argv)
    try:
        try:
            return int(args.func(args))
        except PermissionError as denied:  # one the command did not name itself
            if isinstance(denied, errors.RecoveryError):
                raise
            raise access.denied(denied, f"what recovery {name} reads or writes", "") from denied
    except errors.RecoveryError as err:
        if getattr(args, "json", False):
            print_error_json(err)
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
