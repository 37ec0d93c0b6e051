"""Preemption notices (SIGTERM, SIGUSR1, ...) turned into a clean checkpoint.

The first signal only sets a flag; the training loop sees it at the next step
boundary, where the checkpointer flushes any save in flight, writes one more
checkpoint synchronously and stops the run with
:class:`~recovery.errors.Preempted` (exit code ``checkpoint.preempt_exit_code``, 75 by
default: "checkpointed, requeue me").
A second signal exits at once (128 + signal number): nothing committed can be
damaged, since a half-written save is only ever a temp directory that the next
start removes.

Rejected: saving inside the signal handler. The handler runs between two
arbitrary bytecodes, possibly in the middle of an optimizer step, which is
not a state the run was ever in.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence
from types import FrameType
from typing import Any

from recovery.errors import ConfigError

log = logging.getLogger(__name__)


class PreemptionGuard:
    """Catches preemption signals for the lifetime of a run.

    Args:
        names: signal names, e.g. ``["SIGTERM", "SIGUSR1"]``.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.signals: list[signal.Signals] = []
        for name in names:
            try:
                self.signals.append(signal.Signals[name])
            except KeyError:
                raise ConfigError(f"checkpoint.preempt_signals: unknown signal {name!r}") from None
        self.requested: str | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> PreemptionGuard:
        """Install the handlers (main thread only); returns self."""
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        """Restore the handlers that were there before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            log.error(
                "second preemption signal (%s): exiting now; committed checkpoints are intact", name
            )
            logging.shutdown()
            os._exit(128 + signum)
        self.requested = name
        log.warning("%s received: will checkpoint at the next step boundary and exit", name)
