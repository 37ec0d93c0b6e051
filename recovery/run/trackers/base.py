"""What every tracker shares: a journal observer that fails alone, once, loudly.

A tracker is a :class:`~recovery.run.journal.Observer`: it sees each record after
the journal wrote it. Its failure (a server down, a full disk) must never take
training down, so the first exception turns the tracker off with one warning;
``metrics.jsonl`` still holds every record (and an MLflow resume backfills from it).
"""

from __future__ import annotations

import logging
import math
from typing import Any

log = logging.getLogger(__name__)

NOT_SCALARS = frozenset({"step", "event"})


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """A per-step record's numeric fields (``loss``, ``lr``, ``epoch``, ``update``, ...), finite
    or not; ``step``, booleans and strings (``batch``) left out."""
    return {
        k: float(v)
        for k, v in record.items()
        if k not in NOT_SCALARS and isinstance(v, int | float) and not isinstance(v, bool)
    }


def finite(value: Any) -> bool:
    """A number a tracker can plot."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class Tracker:
    """A journal observer: :meth:`handle` each record, :meth:`finish` at the end; the first
    exception of either turns it off with one warning."""

    name = "tracker"
    failed = False

    def handle(self, record: dict[str, Any]) -> None:
        """Act on one record (subclasses)."""

    def finish(self) -> None:
        """Act on the journal's close (subclasses)."""

    def seen(self, record: dict[str, Any]) -> None:
        if self.failed:
            return
        try:
            self.handle(record)
        except Exception as err:
            self.fail(err)

    def closed(self) -> None:
        try:
            self.finish()
        except Exception as err:
            self.fail(err)

    def fail(self, err: BaseException) -> None:
        """Turn this tracker off; warn the first time."""
        if not self.failed:
            log.warning(
                "%s tracking failed: %s; training goes on without it (metrics.jsonl keeps "
                "every record)",
                self.name,
                str(err).splitlines()[0] if str(err) else type(err).__name__,
            )
        self.failed = True
