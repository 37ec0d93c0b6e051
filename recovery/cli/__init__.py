"""``recovery``: the command line. The only package that prints or chooses exit codes.

One module per command group (:mod:`~recovery.cli.listing`: ls;
:mod:`~recovery.cli.reading`: verify, inspect, audit; :mod:`~recovery.cli.drill`;
:mod:`~recovery.cli.serve`: export, predict; :mod:`~recovery.cli.importing`: import;
:mod:`~recovery.cli.reporting`: report;
:mod:`~recovery.cli.plan`;
:mod:`~recovery.cli.sync`; :mod:`~recovery.cli.keys`), composing the project's config from overrides
(:mod:`~recovery.cli.overrides`, also ``train.py``'s preflight), the exit-code
table in :mod:`~recovery.cli.codes`, and :mod:`~recovery.cli.main`, which parses and dispatches.
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
