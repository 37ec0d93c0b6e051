"""Preemption notices (SIGTERM, SIGUSR1, ...) turned into a clean checkpoint.

The first signal only sets a flag; the training loop sees it at the next step
boundary, where the checkpointer flushes any save in flight, writes one more
checkpoint synchronously and stops the run with
:class:`~recovery.errors.Preempted` (exit code ``checkpoint.preempt_exit_code``, 75 by
default: "checkpointed, requeue me").

Signals arriving within :data:`SAME_REQUEST_S` of the first are the same request:
a scheduler's notice often reaches a process twice (SLURM sends SIGTERM to every
process of a job, and a wrapper in between, torchrun's agent or a job script,
forwards its own copy; submitit's preemption sends SIGTERM and then SIGUSR2; a copy
of the same signal that comes while the first is still pending merges with it).
A signal after that window exits at once (128 + signal number): someone insists,
and nothing committed can be damaged, since a half-written save is only ever a
temp directory that the next start removes.

Rejected: saving inside the signal handler. The handler runs between two
arbitrary bytecodes, possibly in the middle of an optimizer step, which is
not a state the run was ever in. A handler that was installed before the guard
(submitit's, which calls ``checkpoint()`` and requeues the job) is therefore
called only after the run has checkpointed and closed, by :func:`handing_over`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any, Literal

from recovery.errors import ConfigError

log = logging.getLogger(__name__)

SAME_REQUEST_S = 2.0
"""Signals this close (seconds) after the first preemption signal are the same request.

A constant, not a setting: it only has to cover one notice delivered twice, by the
scheduler and by whatever passes it on, which takes milliseconds (measured on SLURM
22.05 here: submitit's preemption, SIGTERM then SIGUSR2 from two ``scancel`` calls,
arrived 13 ms apart; torchrun's agent passed SLURM's SIGUSR1 on to its ranks 4 ms
after they got it), with room for a loaded machine; and short enough that a second
``scancel`` from someone who means it still ends the run at once."""

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

_handovers: list[tuple[signal.Signals, Handler]] | None = None
"""While :func:`handing_over` is active: the handlers that guards replaced for the
signals they caught, in arrival order."""
_installed: list[PreemptionGuard] = []
"""The guards installed inside the active :func:`handing_over` block (uninstalled by its
end if the run did not close them)."""


def classify(
    first_at: float | None, now: float, window_s: float = SAME_REQUEST_S
) -> Literal["first", "same", "again"]:
    """What a preemption signal arriving at ``now`` is.

    Args:
        first_at: when the first signal of the run arrived (``None``: none yet).
        now: when this one arrived (same clock).
        window_s: how long after the first a signal is still the same request.

    Returns:
        ``"first"``: a new request; ``"same"``: part of the request already made;
        ``"again"``: a second request, which exits the process at once.
    """
    if first_at is None:
        return "first"
    return "same" if now - first_at <= window_s else "again"


def agreed(names: Sequence[str], time_limit_signal: str | None) -> str | None:
    """The signal a multi-rank job stops on, from each rank's first signal (``""``: none
    yet), in rank order: the time limit's if any rank saw it (it decides the requeue),
    else the lowest rank's; ``None`` when no rank saw any."""
    if time_limit_signal is not None and time_limit_signal in names:
        return time_limit_signal
    return next((name for name in names if name), None)


class PreemptionGuard:
    """Catches preemption signals for the lifetime of a run.

    Args:
        names: signal names, e.g. ``["SIGTERM", "SIGUSR1"]``.
        window_s: signals within this many seconds of the first count as one
            request (:data:`SAME_REQUEST_S`); a later one exits at once.
        clock: the time source of the window (a test's fake clock).
    """

    def __init__(
        self,
        names: Sequence[str],
        *,
        window_s: float = SAME_REQUEST_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.signals: list[signal.Signals] = []
        for name in names:
            try:
                self.signals.append(signal.Signals[name])
            except KeyError:
                raise ConfigError(f"checkpoint.preempt_signals: unknown signal {name!r}") from None
        self.requested: str | None = None
        """The first signal's name, once one arrived."""
        self.received: list[signal.Signals] = []
        """Every signal of the request, in arrival order (the first included)."""
        self.window_s = window_s
        self._clock = clock
        self._first_at: float | None = None
        self._previous: dict[signal.Signals, Handler] = {}

    def install(self) -> PreemptionGuard:
        """Install the handlers (main thread only); returns self."""
        for sig in self.signals:
            previous = signal.signal(sig, self._handle)
            # an earlier guard's stand-in for the default (:meth:`_late`) is the default
            late = getattr(previous, "__func__", None) is PreemptionGuard._late
            self._previous[sig] = signal.SIG_DFL if late else previous
        if _handovers is not None:
            _installed.append(self)
        return self

    def join(self, name: str) -> None:
        """The ranks of a job agreed to stop on ``name`` (which another rank may have got
        first): it is this guard's request too, as if it had arrived now, so this rank's
        own copy, coming later, is the same request (:data:`SAME_REQUEST_S`) and is
        handed over (:func:`handing_over`) as a caught one."""
        sig = signal.Signals[name] if name in signal.Signals.__members__ else None
        if sig in self.signals and sig not in self.received:
            self.received.append(sig)
        if self.requested is None:
            self._first_at, self.requested = self._clock(), name

    def uninstall(self) -> None:
        """Restore the handlers that were there before.

        Inside :func:`handing_over`, the handlers it restores for the signals it
        caught are remembered, to be called when that block ends. After a request, a
        signal whose handler was the default (which ends the process) stays caught
        until the request's window is over: a copy that comes after the run closed is
        the same request, not a second one; later, it does what the default does.
        """
        if _handovers is not None:  # each signal once, however many copies came
            _handovers.extend(
                (sig, self._previous[sig])
                for sig in dict.fromkeys(self.received)
                if sig in self._previous
            )
        within = self._first_at is not None and self._clock() - self._first_at <= self.window_s
        for sig, handler in self._previous.items():
            signal.signal(sig, self._late if within and handler == signal.SIG_DFL else handler)
        self._previous.clear()

    def _late(self, signum: int, frame: FrameType | None) -> None:
        """A copy after the guard was uninstalled: the same request within the window,
        else what the default handler does (the process ends on that signal)."""
        assert self._first_at is not None
        if self._clock() - self._first_at <= self.window_s:
            log.info("%s after the run closed: the same preemption", signal.Signals(signum).name)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig, now = signal.Signals(signum), self._clock()
        kind = classify(self._first_at, now, self.window_s)
        if kind == "again":
            log.error(
                "second preemption signal (%s): exiting now; committed checkpoints are intact",
                sig.name,
            )
            logging.shutdown()
            os._exit(128 + signum)
        self.received.append(sig)
        if kind == "same":
            log.info(
                "%s within %g s of %s: the same preemption", sig.name, self.window_s, self.requested
            )
            return
        self._first_at, self.requested = now, sig.name
        log.warning("%s received: will checkpoint at the next step boundary and exit", sig.name)


@contextlib.contextmanager
def handing_over() -> Iterator[None]:
    """Pass the signals a guard caught on to the handlers it had replaced, once the
    run inside this block has ended (checkpointed and closed, or failed).

    For a scheduler's client that handles the same signal itself: submitit's handler
    for its preemption signal calls the job's ``checkpoint()`` and requeues the job,
    which must happen after the checkpoint of the step boundary, not in the middle of
    a step (:mod:`recovery.run.scheduling.submitit`). Only Python handlers are called, once for
    each signal the guard caught (a copy of one is the same), in arrival order;
    ``SIG_DFL`` and ``SIG_IGN`` are left alone (a preempted run exits with its own
    code; so is ``signal.default_int_handler``: a run stopped by SIGINT exits with its own
    code, not with ``KeyboardInterrupt``). A guard installed inside the block and still
    installed when it ends (a run that leaves without closing its checkpointer) is
    uninstalled first, so its signals are handed over too. Whatever such a handler
    raises (submitit: ``SystemExit`` after the requeue) leaves the block instead of
    what was leaving it. Main thread only;
    inside another such block it does nothing (the outer block hands over).
    """
    global _handovers
    if _handovers is not None:
        yield
        return
    handed: list[tuple[signal.Signals, Handler]] = []
    _handovers = handed
    try:
        yield
    finally:
        for guard in _installed:
            if guard._previous:  # still installed: the run did not close its checkpointer
                guard.uninstall()
        _installed.clear()
        _handovers = None
        for sig, handler in handed:
            if callable(handler) and handler is not signal.default_int_handler:
                log.info("handing %s over to the handler installed before the guard", sig.name)
                handler(int(sig), None)
