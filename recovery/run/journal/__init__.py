"""The per-step record: ``<run dir>/metrics.jsonl``, append-only JSON lines.

One line per optimizer step (``step``, ``epoch``, ``loss``, ``lr``, ``batch``
and whatever else the recipe adds) and one line per event
(``{"event": "resume", ...}``). A run killed between checkpoints has already
written lines for steps that its resume will redo; the file keeps both, in
order, and :func:`effective_steps` reads it as "the last record of each step
wins", which is the history of the run that survived.

A watcher (:meth:`Journal.watch`; the checkpointer's
:class:`~recovery.run.monitoring.watch.Watch`) sees every per-step record (one with ``step``
and no ``event``): it may add fields before the record is written (``lr``,
``update``) and observes it after (the resume health monitor), so any loop that
writes its per-step record here is monitored. An observer (:meth:`Journal.tap`; the
trackers of :mod:`recovery.run.trackers`) sees every record, events included,
after it is written, and the journal's end; one that raises is dropped with a
warning, so a tracker can never stop the run that feeds it.

Lines are flushed to the OS as they are written, so a SIGKILL loses none of
them; a torn last line (power loss) is skipped when reading and a newline is
written before the next append so it cannot corrupt the next record.

The events a resume acts on (:data:`recovery.integrity.keys.seal.STEERING`) are
sealed as they are written, once the checkpointer hands the journal its
signing key (:meth:`Journal.seal_with`): signed and chained, so that a line
someone else appends is ignored by the next resume instead of obeyed. The file
is opened without following a symlink: one planted under its name is refused
(:class:`~recovery.errors.UnsafePathError`), never written through.

Beside it the writer keeps an index (``metrics.jsonl.index``,
:mod:`recovery.run.journal.index`): where the events lie and which steps each
stretch of lines holds, so that a resume and ``recovery ls`` read the events and
the steps after one checkpoint, not the whole run (:mod:`recovery.run.journal.reading`).
"""

from recovery.run.journal.reading import (
    effective_steps,
    events,
    read,
    read_numbered,
    sealed_chain,
    steps_after,
)
from recovery.run.journal.writer import BEGIN_EVENTS, Journal, Observer, Watcher, is_step

__all__ = [
    "BEGIN_EVENTS",
    "Journal",
    "Observer",
    "Watcher",
    "effective_steps",
    "events",
    "is_step",
    "read",
    "read_numbered",
    "sealed_chain",
    "steps_after",
]
