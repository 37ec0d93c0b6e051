"""The ending half of :class:`~recovery.run.checkpointer.Checkpointer`: after a commit and
at the end of the run.

What follows a commit (link, best copy, retention, cost record, DVC); flushing
the save in flight; and closing the run (costs recorded; the watch, lock,
guard and journal the checkpointer made, released). As a context manager the
checkpointer closes itself, and a library error leaving the block ends the
process as ``recovery`` and ``train.py`` do: one line on stderr and the README's
exit code (:mod:`recovery.exitcodes`; :class:`~recovery.errors.Preempted`:
``checkpoint.preempt_exit_code``, 75 by default, "checkpointed, requeue me"; with
``checkpoint.cluster.requeue`` the SLURM job is requeued first), so an own loop needs
no ``try``. A loop at module level without a with-block gets the same
from :meth:`Ending.exit_on_error`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import Self

from recovery.config import parse_duration
from recovery.errors import Preempted, RecoveryError
from recovery.exitcodes import exit_code
from recovery.format.manifest import Manifest
from recovery.integrity.reaping import Reaper
from recovery.integrity.signing import Signer
from recovery.provenance import lineage
from recovery.run import retention
from recovery.run.cadence import Cadence
from recovery.run.job import SaveJob
from recovery.run.savers import Cost, Inline
from recovery.run.scheduling import Scheduled
from recovery.storage import tracking

log = logging.getLogger(__name__)


class Ending(Scheduled):
    """After-commit and close (the checkpointer's base, which sets these attributes)."""

    publisher: tracking.Publisher | None
    signer: Signer
    cadence: Cadence
    pause_s: float
    _saver: Inline
    _reaper: Reaper
    _created: float
    _closed: bool = False
    persisted: int | None = None
    """The step of the newest checkpoint committed in the run directory (or resumed from
    there): not a save merely submitted."""

    def _committed(self, job: SaveJob, mf: Manifest, cost: Cost) -> None:
        """After a commit (on whichever thread wrote it): link, keep best, retain, record, push."""
        if job.chained:
            previous, parent = job.statement.get("previous"), job.statement.get("parent")
            link = self.identity.previous = lineage.link(mf, job.final, self.root)
            retired = retention.after_commit(
                self.cfg,
                self.run_dir,
                job.final,
                mf,
                trust=self.trust,
                allow_untrusted=self.allow_untrusted,
                retire=self.publisher.retire if self.publisher is not None else None,
                reaper=self._reaper,
            )
            self.persisted = job.step
            self.cadence.measured(cost_s=cost.planned_s, persist_s=cost.write_s)
            if retired:  # so a later resume knows these are gone on purpose (run.history)
                self._event({"event": "retired", "steps": retired})
            # the run id binds a commit to its run when the chain around it is broken
            # and its lineage (digest, signer, what it follows), for the trackers and readers
            artifact = {
                **link,
                "signer": self.signer.key_id,
                "previous": previous.get("sha256") if isinstance(previous, dict) else None,
                "parent": parent.get("sha256") if isinstance(parent, dict) else None,
            }
            self._event(
                {
                    **cost.event(job.step, sum(r.size for r in mf.files)),
                    "run_id": self.run_id,
                    "artifact": artifact,
                }
            )
        if self.publisher is not None:
            self.publisher.submit(job.final)
        log.info("%s %s committed (%.3fs)", job.purpose, job.final, cost.write_s)

    def flush(self) -> None:
        """Wait until the background save in flight (if any) is committed, and the
        checkpoints retention retired are deleted.

        Raises:
            CommitError: it failed.
        """
        try:
            self.pause_s += self._saver.wait()
        finally:
            self._reaper.close()

    def close(self) -> None:
        """Flush the save in flight, stop the background thread, record the run's costs.

        Also judges a resume-health window the run ended inside, stops watching,
        uninstalls the preemption guard and closes the journal, where the
        checkpointer made them.

        Raises:
            CommitError: the last background save failed.
        """
        if self._closed:  # once: a with-block closes what an explicit close() closed
            return
        self._closed = True
        failed = True
        try:
            self.pause_s += self._saver.close()
            failed = False
        finally:
            self._reaper.close()  # retired directories fully deleted before the run ends
            self._release()
            if self.publisher is not None:
                self.publisher.close(parse_duration(self.cfg.dvc.close_timeout))
            summary = self.cadence.summary(time.perf_counter() - self._created, self.pause_s)
            # the saver's error is the run's: a summary the same full disk refuses must not
            # replace it
            with contextlib.suppress(*((RecoveryError, OSError) if failed else ())):
                self._event(summary)
            if self._owned[0]:
                self.journal.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close; a library error leaving the block ends the process with its exit code and
        one line (:class:`~recovery.errors.Preempted`: ``checkpoint.preempt_exit_code``);
        anything else propagates."""
        try:
            self.close()
        except RecoveryError as failed:  # the last background save failed
            if not isinstance(err, RecoveryError):
                err = failed
        if isinstance(err, RecoveryError):
            code = _one_line(err)
            self.requeue_after(err)  # closed: the journal has its last record
            raise SystemExit(code) from err

    def exit_on_error(self) -> None:
        """For a loop at module level, without a with-block: from now on an uncaught library
        error (:class:`~recovery.errors.Preempted` included) closes this checkpointer, prints
        one line and ends the process with its exit code, as the with-block does. Other
        exceptions keep Python's own handling. Call it on the main thread.
        """
        previous = sys.excepthook

        def hook(kind: type[BaseException], err: BaseException, tb: TracebackType | None) -> None:
            if not isinstance(err, RecoveryError):
                previous(kind, err, tb)
                return
            try:
                self.close()
            except RecoveryError as failed:
                log.error("while closing: %s", failed)
            code = _one_line(err)
            self.requeue_after(err)
            atexit._run_exitfuncs()  # what the interpreter's own exit would still run
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(code)  # an excepthook cannot choose the exit status otherwise

        if threading.current_thread() is not threading.main_thread():
            log.warning("exit_on_error: not on the main thread; errors propagate as raised")
            return
        sys.excepthook = hook


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


def _one_line(err: RecoveryError) -> int:
    """Log ``err`` as the CLI prints it (one line) and return its exit code."""
    code = exit_code(err)
    if isinstance(err, Preempted):
        log.warning("%s", err)
    else:
        log.error("error: %s (exit %d)", one_line(str(err)) or type(err).__name__, code)
    return code
