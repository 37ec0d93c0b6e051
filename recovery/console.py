"""Where the package's log lines go when the application set up no logging.

A run's resume, its verdict and its fallbacks are log records of the ``recovery``
loggers. A script that configures no logging would show only warnings (Python's
last-resort handler), so an own loop's resume would say nothing. :func:`show`,
called when a :class:`~recovery.run.checkpointer.Checkpointer` is made, gives the
package logger a stderr handler at INFO in that case only, as Lightning does for
its own logger: under an application's logging config (``logging.basicConfig``,
Hydra's, pytest's) nothing changes, and an application that configures logging
later takes over at the package's next record: that record goes to the application's
handlers once, if the application's level lets it through, and so does every later one.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

PACKAGE = "recovery"


class _Fallback(logging.StreamHandler):  # type: ignore[type-arg]
    """Prints the package's records, message only, to the current ``sys.stderr`` (looked
    up at each record, as Python's last-resort handler does), while nothing else would."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ assigns it
        pass

    def emit(self, record: logging.LogRecord) -> None:
        root = logging.getLogger()
        if not root.handlers:
            super().emit(record)
            return
        # configured since: the package is the application's again. The logger's
        # ``propagate`` is read once its handlers ran, so setting it here sends this very
        # record on to the root's handlers, once; a record below the root's level stops
        # here, and the next one is let through (Python checks a level where a record is
        # made, and the package's INFO let this one in)
        logger = logging.getLogger(PACKAGE)
        logger.removeHandler(self)
        logger.setLevel(logging.NOTSET)
        if record.levelno >= root.getEffectiveLevel():
            logger.propagate = True
        else:
            logger.addHandler(_Reopen())


class _Reopen(logging.Handler):
    """Sends the package's next record on to the root's handlers, then steps aside."""

    def emit(self, record: logging.LogRecord) -> None:
        logger = logging.getLogger(PACKAGE)
        logger.removeHandler(self)
        logger.propagate = True


def show() -> None:
    """Show the package's INFO records on stderr if the application configured no logging.

    Nothing happens when the root logger has a handler, or when the ``recovery`` logger
    already has a handler or a level of its own (the application chose); calling it again
    is harmless.
    """
    logger = logging.getLogger(PACKAGE)
    if logger.handlers or logger.level != logging.NOTSET or logging.getLogger().handlers:
        return
    logger.addHandler(_Fallback())
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the root has no handler: only the last resort would print


def withdraw() -> None:
    """Undo :func:`show` (the application's logging config takes over)."""
    logger = logging.getLogger(PACKAGE)
    mine = [h for h in logger.handlers if isinstance(h, _Fallback | _Reopen)]
    for handler in mine:
        logger.removeHandler(handler)
    if mine:
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
