"""``recovery``: the command line. The only package that prints or chooses exit codes.

One module per command group in :mod:`recovery.cli.commands` (``listing``: ls;
``reading``: verify, inspect, audit; ``drill``; ``serve``: export, predict;
``importing``: import; ``reporting``: report; ``plan``; ``sync``; ``keys``;
``tierrows``: ls's local-tier rows); beside them what every command shares: composing
the project's config from overrides (:mod:`~recovery.cli.overrides`, also ``train.py``'s
preflight), the exit-code table in :mod:`~recovery.cli.codes`, the help text of every
command (:mod:`~recovery.cli.helptext`), and :mod:`~recovery.cli.main`, which parses and
dispatches.
"""

from recovery.cli.codes import EXIT_CODES, exit_code, report
from recovery.cli.common import parameters_digest
from recovery.cli.main import build_parser, main, main_entry
from recovery.cli.overrides import preflight

__all__ = [
    "EXIT_CODES",
    "build_parser",
    "exit_code",
    "main",
    "main_entry",
    "parameters_digest",
    "preflight",
    "report",
]
