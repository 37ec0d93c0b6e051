"""Every resume checks itself: the redone steps against the record of the run that died.

A process killed between checkpoints has already journaled the steps after its
last checkpoint; the process that resumes from that checkpoint recomputes exactly
those steps. If the resume restored everything the run depends on, each redone
step's per-step record (the loss, whatever the loop records, the learning rate,
the update size and the digest of the batch's example ids) is the same, to the
bit on CPU. If it is not, something the checkpoint does not hold steered the
run: a batch fetched before the step, a recurrent hidden state, an evaluation
loader drawing from the global random stream, work done at an epoch's end after
the epoch's last save. Nothing else tells: the resumed run trains on, a
different run, silently.

:class:`ResumeCheck` watches the resumed process's per-step records through the
journal (:meth:`recovery.run.journal.Journal.watch`), so it works in the recipes
and in any own loop that records its steps. The first differing step is a loud
``INEXACT RESUME`` warning and a ``resume_check`` event naming the step, the
field, both values and the likely causes; when the last redone step is reached
(or the run ends first) a ``resume_check`` summary says how many redone steps
were compared and how many were bit-identical. ``strict`` turns a difference
into :class:`~recovery.errors.InexactResumeError` (exit 30) at that step, before
anything after it is saved.

What is compared costs nothing extra to read: the resume already reads the
journal once (:mod:`recovery.run.restoring.history`), and only the records of steps after
the checkpoint are kept. :func:`compare` is a pure function (table-tested).

Rejected: comparing only the loss. A data-order mistake shows first in the
batch digest, and naming it as such points at the loader rather than the model.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recovery.config import ResumeCheckConfig
from recovery.errors import InexactResumeError
from recovery.run.journal import Journal

log = logging.getLogger(__name__)

EVENT = "resume_check"
EXACT, INEXACT, INCOMPLETE, SKIPPED = "exact", "inexact", "incomplete", "skipped"
"""A check's status: every redone step compared equal; a step differed; the run ended
before it redid any step it could compare; not compared, by design (a resume onto another
world size reseeds the RNG streams)."""
BATCH = "batch"
NOT_COMPARED = frozenset({"step", "event"})
MODULES = ("parameters", "buffers")
"""The fingerprint fields (:mod:`recovery.run.monitoring.fingerprint`): compared last."""
FIRST = (BATCH, "loss")
"""Compared first, in this order: a data-order mistake is named as such."""

CAUSES_DATA = (
    "the data order differs: the batches drawn are not those the run that died drew "
    "(a loader not registered as the state's sampler, a loader or sampler without its own "
    "seed/generator, or a batch fetched before the step and not registered: register it "
    "with recovery.LoopState)"
)
CAUSES_LR = (
    "the learning rate differs: a scheduler stepped after the save (an epoch's end "
    "scheduler.step() after maybe_save: do it before, on the epoch's last batch), or a rate "
    "set by hand from a value the checkpoint does not hold (register it with recovery.LoopState)"
)
CAUSES_STATE = (
    "loop state the checkpoint does not hold: a batch fetched before the step or a "
    "recurrent hidden state (register it with recovery.LoopState); an evaluation "
    "DataLoader without generator= drawing from the global random stream; work at an "
    "epoch's end after the epoch's last save (do it before maybe_save); nondeterministic "
    "kernels (set checkpoint.resume_check.rtol/atol)"
)

CAUSES_MODULES = (
    "the module state differs though the per-step numbers before it matched: work outside "
    "the optimizer step changed parameters or buffers at other steps than in the run that "
    "died (a forward pass in train mode moves BatchNorm's running statistics; a batch "
    "counter from enumerate() restarts at 0 after a resume: count from the step or "
    "loader.batch_index), or a module the loop changes is not registered"
)


@dataclass(frozen=True)
class Difference:
    """The first field of a redone step that differs from the dead run's record."""

    step: int
    field: str
    expected: Any
    """What the run that died recorded."""
    found: Any
    """What the resumed run recorded."""

    def describe(self, resumed_at: int, drift: Sequence[str] = ()) -> str:
        """The one-line warning; ``drift``: what this resume reported as changed since the
        checkpoint (its DRIFT lines), named as the likely cause before the loop is."""
        by_field = {BATCH: CAUSES_DATA, "lr": CAUSES_LR, **dict.fromkeys(MODULES, CAUSES_MODULES)}
        causes = by_field.get(self.field, CAUSES_STATE)
        if drift:
            shown = "; ".join(drift[:3]) + ("; ..." if len(drift) > 3 else "")
            causes = f"what changed since the checkpoint (DRIFT: {shown}). Otherwise: {causes}"
        return (
            f"INEXACT RESUME at step {self.step} (resumed from step {resumed_at}): "
            f"{self.field} was {_show(self.expected)} in the run that died, "
            f"{_show(self.found)} now; the resumed run is not the run that died. "
            f"Likely: {causes}"
        )

    def record(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "field": self.field,
            "expected": self.expected,
            "found": self.found,
        }


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value!r} ({value.hex()})"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def same(a: Any, b: Any, *, rtol: float = 0.0, atol: float = 0.0) -> bool:
    """Whether two journaled values agree: numbers within ``atol + rtol * |a|`` (both 0:
    equal; NaN equals NaN), lists and dicts element by element, anything else by ``==``."""
    if _number(a) and _number(b):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        if rtol == 0 and atol == 0:
            return bool(a == b)
        return bool(abs(a - b) <= atol + rtol * abs(a))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(
            same(x, y, rtol=rtol, atol=atol) for x, y in zip(a, b, strict=True)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rtol=rtol, atol=atol) for k in a)
    return bool(a == b)


def compare(
    expected: Mapping[str, Any],
    found: Mapping[str, Any],
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    ignore: frozenset[str] = frozenset(),
) -> tuple[str, Any, Any] | None:
    """The first field both records hold that differs: ``(field, expected, found)``, or
    ``None``. ``batch`` and ``loss`` first, then the rest by name, the modules'
    fingerprints last; ``step``, events and
    ``ignore`` are not compared, and a field only one side recorded is not either."""
    shared = set(expected) & set(found) - NOT_COMPARED - ignore
    last = [k for k in MODULES if k in shared]  # what the numbers before it do not explain
    order = [k for k in FIRST if k in shared] + sorted(shared - {*FIRST, *MODULES}) + last
    for key in order:
        if not same(expected[key], found[key], rtol=rtol, atol=atol):
            return key, expected[key], found[key]
    return None


class ResumeCheck:
    """Compares a resumed process's per-step records with those the run journaled before.

    Args:
        expected: step -> the last record the earlier processes journaled for it, for the
            steps after the checkpoint (what the resume redoes).
        resumed_at: the checkpoint's step.
        cfg: tolerances, strictness and the fields not compared.
        journal: where the verdicts are written (rank 0's; a discarding one elsewhere).
        rank: this process's rank, named in its log lines under torchrun.
        done: called with the summary once it is written (the checkpointer signs it
            into the run's lineage: :func:`signed`).
        drift: the resume's DRIFT lines: a difference names them as its likely cause.
    """

    def __init__(
        self,
        expected: Mapping[int, Mapping[str, Any]],
        *,
        resumed_at: int,
        cfg: ResumeCheckConfig,
        journal: Journal,
        rank: int = 0,
        done: Callable[[dict[str, Any]], None] | None = None,
        drift: Sequence[str] = (),
    ) -> None:
        self.expected = {s: r for s, r in expected.items() if s > resumed_at}
        self.drift = list(drift)
        self.resumed_at = resumed_at
        self.cfg = cfg
        self.journal = journal
        self.rank = rank
        self.last = max(self.expected, default=resumed_at)
        self.compared = 0
        self.identical = 0
        self.first: Difference | None = None
        self.done = not self.expected
        self._ignore = frozenset(cfg.ignore)
        self._done = done

    # -- Journal.watch -------------------------------------------------------------

    def annotate(self, record: dict[str, Any]) -> dict[str, Any]:
        return {}

    def observed(self, record: dict[str, Any]) -> None:
        """Compare a per-step record of the resumed run with the dead run's, if it redoes one.

        Raises:
            InexactResumeError: ``strict``, and this is the first differing step.
        """
        step = record.get("step")
        if self.done or not isinstance(step, int):
            return
        before = self.expected.get(step)
        if before is not None:
            self._compare(step, before, record)
        if step >= self.last:
            self.finish()

    def _compare(self, step: int, before: Mapping[str, Any], now: Mapping[str, Any]) -> None:
        self.compared += 1
        diff = compare(before, now, rtol=self.cfg.rtol, atol=self.cfg.atol, ignore=self._ignore)
        if diff is None:
            self.identical += 1
            return
        if self.first is not None:
            return
        self.first = Difference(step, *diff)
        message = self._prefix() + self.first.describe(self.resumed_at, self.drift)
        log.warning("%s", message)
        self.journal.write(
            {
                "event": EVENT,
                "status": INEXACT,
                "resumed_at": self.resumed_at,
                "first": self.first.record(),
                "strict": self.cfg.strict,
            }
        )
        if self.cfg.strict:
            self.done = True
            raise InexactResumeError(
                message + " (checkpoint.resume_check.strict: stopped before anything "
                "after this step was saved)",
                step=step,
                field=self.first.field,
            )

    def _prefix(self) -> str:
        return f"rank {self.rank}: " if self.rank else ""

    @property
    def status(self) -> str:
        """:data:`EXACT`, :data:`INEXACT` or :data:`INCOMPLETE` (nothing compared yet)."""
        if self.first is not None:
            return INEXACT
        return EXACT if self.compared else INCOMPLETE

    def summary(self) -> dict[str, Any]:
        """The ``resume_check`` summary event."""
        return {
            "event": EVENT,
            "status": self.status,
            "resumed_at": self.resumed_at,
            "redone": [self.resumed_at + 1, self.last],
            "compared": self.compared,
            "identical": self.identical,
            **({"first": self.first.record()} if self.first is not None else {}),
            **(
                {"tolerance": {"rtol": self.cfg.rtol, "atol": self.cfg.atol}}
                if self.cfg.rtol or self.cfg.atol
                else {}
            ),
            "summary": True,
        }

    def _tolerance(self) -> dict[str, Any]:
        if not (self.cfg.rtol or self.cfg.atol):
            return {}
        return {"tolerance": {"rtol": self.cfg.rtol, "atol": self.cfg.atol}}

    def describe(self) -> str:
        """The summary's log line."""
        exactly = "within tolerance" if self.cfg.rtol or self.cfg.atol else "bit-identical"
        span = f"steps {self.resumed_at + 1}-{self.last}"
        if self.first is not None:
            return (
                f"INEXACT RESUME from step {self.resumed_at}: {self.identical} of "
                f"{self.compared} redone steps {exactly} ({span}); first difference at step "
                f"{self.first.step} ({self.first.field})"
            )
        if not self.compared:
            return f"resume check from step {self.resumed_at}: no redone step was compared"
        return (
            f"resume check: {self.identical} redone steps {exactly} with the run that died "
            f"({span}, resumed from step {self.resumed_at})"
        )

    def finish(self) -> None:
        """Write the summary once: at the last redone step, or when the run ends before it
        (:meth:`recovery.run.checkpointer.Checkpointer.close`), if there was anything to redo."""
        if self.done:
            return
        self.done = True
        line = self._prefix() + self.describe()
        if self.first is not None:
            log.warning("%s", line)
        else:
            log.info("%s", line)
        summary = self.summary()
        self.journal.write(summary)
        self.journal.unwatch(self)
        if self._done is not None:
            self._done(summary)


TURNED_OFF = "the resume check is off (checkpoint.resume_check.enabled=false)"
RESHARDED = "resharded onto another world size"
REPLACED = "another run's checkpoint, continued as asked: this journal's steps are not its own"
"""Why a resume is not compared: the ``reason`` of :func:`skipped`."""


def nothing_redone(resumed_at: int, final_step: int) -> str:
    """Why a resume has no redone step to compare (the ``reason`` of :func:`skipped`)."""
    if resumed_at >= final_step:
        return "nothing to compare: the run had finished"
    return "nothing to compare: no step was journaled after this checkpoint"


def skipped(resumed_at: int, reason: str) -> dict[str, Any]:
    """The ``resume_check`` event of a resume that is not compared, and why."""
    log.info("resume check from step %d: not compared (%s)", resumed_at, reason)
    return {
        "event": EVENT,
        "status": SKIPPED,
        "resumed_at": resumed_at,
        "reason": reason,
        "summary": True,
    }


def signed(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What of a summary the run's lineage segment carries (in every later checkpoint's
    signed statement, so ``recovery audit`` shows it without the journal)."""
    keys = ("status", "compared", "identical", "redone", "first", "tolerance", "reason")
    return {k: summary[k] for k in keys if k in summary}


def verdict(check: Mapping[str, Any]) -> str:
    """A check in a few words: ``5 of 5 redone steps bit-identical``, ``INEXACT at step 42
    (loss); 3 of 5 identical``, ``not compared (why)``."""
    first = check.get("first") if isinstance(check.get("first"), dict) else None
    status = check.get("status")
    if status == INEXACT and first is not None:
        counted = (
            f"; {check.get('identical')} of {check.get('compared')} identical"
            if "compared" in check
            else ""
        )
        return f"INEXACT at step {first.get('step')} ({first.get('field')}){counted}"
    if status == EXACT:
        exactly = "within tolerance" if check.get("tolerance") else "bit-identical"
        return f"{check.get('identical')} of {check.get('compared')} redone steps {exactly}"
    if status == SKIPPED:
        return f"not compared ({check.get('reason')})"
    return "not compared"
