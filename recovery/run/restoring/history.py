"""What a run's own journal knows about it: its id and the newest checkpoint it committed.

Scanning the directory finds what is on disk; the journal (``metrics.jsonl``)
records what the run did. The two disagree in exactly the cases an attacker
or an accident produces: the newest good checkpoint deleted (a scan finds an
older one and would resume from it silently: a *rollback*), or another run's
validly signed checkpoint planted in the directory (a scan would adopt it,
run id and all: a *substitution*). These are small pure functions over the
journal's records, so each case is a table test. A writer reads the journal
with its trust store (:func:`read`): then only the steering events that are
sealed and chained (:mod:`recovery.integrity.keys.seal`) are believed, and every
other one is named in a loud warning and ignored.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from recovery.integrity.keys.signing import TrustStore
from recovery.run import journal

log = logging.getLogger(__name__)

# where an abandoned branch may be moved: one fixed-form name under abandoned/ (even a
# sealed event must not be able to send a checkpoint anywhere else)
_BRANCH = re.compile(r"^abandoned/from-\d{8,}-\d{8}T\d{6}$")
"""Events that name the run id the process continued as."""


@dataclass(frozen=True)
class History:
    """A run's record of itself."""

    run_id: str | None = None
    """The run id the last process of this run ran as (``None``: no journal, or no event)."""
    committed: frozenset[int] = field(default_factory=frozenset)
    """Steps of the continuation checkpoints it committed."""
    retired: frozenset[int] = field(default_factory=frozenset)
    """Steps it deleted (retention) or moved aside (an abandoned branch)."""
    abandoned: dict[int, str] = field(default_factory=dict)
    """Steps of an abandoned branch not written again since -> where they were moved
    (relative to the run directory)."""
    tip: str = ""
    """The link of the last sealed event that verifies (empty: none): where the writer's next sealed
    event chains on (:meth:`~recovery.run.journal.Journal.chain_from`)."""

    @property
    def newest(self) -> int | None:
        """The newest committed step not retired."""
        alive = self.committed - self.retired
        return max(alive) if alive else None


def from_records(records: Iterable[dict[str, Any]]) -> History:
    """The history in journal records, in file order."""
    run_id: str | None = None
    committed: set[int] = set()
    retired: set[int] = set()
    abandoned: dict[int, str] = {}
    for rec in records:
        event = rec.get("event")
        if event in journal.BEGIN_EVENTS and isinstance(rec.get("run_id"), str):
            run_id = rec["run_id"]
        elif event == "checkpoint" and isinstance(rec.get("step"), int):
            committed.add(rec["step"])
            retired.discard(rec["step"])  # the same step written again (a branch)
            abandoned.pop(rec["step"], None)
        elif event in ("retired", "abandoned"):
            steps = [s for s in rec.get("steps", []) if isinstance(s, int)]
            retired.update(steps)
            to = rec.get("to")
            if event == "abandoned" and isinstance(to, str) and _BRANCH.match(to):
                abandoned.update(dict.fromkeys(steps, to))
    return History(run_id, frozenset(committed), frozenset(retired), abandoned)


_WARNED: set[tuple[str, int]] = set()
"""(journal, line) of refused events already warned about by this process: a resume
that falls back past a damaged checkpoint reads the journal again."""


def read(path: Path, trust: TrustStore) -> History:
    """The history in the journal at ``path`` (empty when there is none), as a writer about
    to act on it reads it: steering events that are not sealed by a key in ``trust`` and
    chained are ignored, each named in one warning (a sealed commit cut out of the chain
    still counts as a commit of its run).
    """
    if not path.is_file():
        return History()
    checked = journal.sealed_chain(path, trust)
    new = [r for r in checked.refused if (str(path), r.line) not in _WARNED]
    if new:
        _WARNED.update((str(path), r.line) for r in new)
        shown = "; ".join(r.describe() for r in new[:3])
        more = f"; and {len(new) - 3} more" if len(new) > 3 else ""
        log.warning(
            "JOURNAL EVENTS IGNORED in %s: %d event(s) a resume would act on do not "
            "authenticate, so this resume does not obey them: %s%s. Someone or something "
            "wrote to the journal besides this run's writer; its rollback and substitution "
            "checks use only the events that verify",
            path,
            len(new),
            shown,
            more,
        )
    past = replace(from_records(checked.obeyed), tip=checked.tip)
    # a commit signed by the writer but cut out of the chain still counts: it can only make
    # the resume more cautious (a broken chain must not hide a rollback)
    commits = {
        r["step"]
        for r in checked.stray
        if r.get("event") == "checkpoint"
        and isinstance(r.get("step"), int)
        and (past.run_id is None or r.get("run_id") == past.run_id)
    }
    if commits - past.committed:
        past = replace(past, committed=past.committed | commits)
    return past


def rollback(history: History, step: int) -> str | None:
    """Why resuming ``step`` rolls the run back, or ``None`` when it does not."""
    newest = history.newest
    if newest is None or step >= newest:
        return None
    return (
        f"the run committed step {newest} (its journal says so, and retention did not delete "
        f"it), but the newest checkpoint that verifies is step {step}: step {newest} was "
        "deleted or damaged"
    )


def foreign(history: History, run_id: object) -> bool:
    """Whether a checkpoint of ``run_id`` belongs to another run than this one."""
    return history.run_id is not None and run_id != history.run_id
