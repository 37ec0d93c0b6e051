"""The journal's readers: every record (:func:`read`), each step's last record
(:func:`effective_steps`), and what a resume and ``recovery ls`` need, in time that does
not grow with the run: the events (:func:`events`) and the per-step records after one
checkpoint (:func:`steps_after`), read through the index where one matches
(:mod:`recovery.run.journal.index`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from recovery.format import bounded
from recovery.integrity.keys import seal
from recovery.integrity.keys.signing import TrustStore
from recovery.run.journal import index

log = logging.getLogger(__name__)


def read_numbered(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """Every parseable record with its line number, in file order (a torn or malformed
    line, one that is not UTF-8, or one that is no JSON object, is skipped with a warning).
    A line ends at ``\n`` only, as the index counts lines (:func:`.index.lines`)."""
    records = []
    data = path.read_bytes()
    for n, raw in enumerate(index.lines(data, 0, len(data)), 1):
        if not raw.strip():
            continue
        try:
            record = bounded.json_loads(raw.decode("utf-8"))
        except ValueError as err:
            log.warning("%s:%d: skipping a torn or malformed record (%s)", path, n, err)
            continue
        if isinstance(record, dict):
            records.append((n, record))
        else:
            log.warning("%s:%d: skipping a record that is no JSON object", path, n)
    return records


def read(path: Path) -> list[dict[str, Any]]:
    """Every parseable record, in file order (a torn line is skipped with a warning)."""
    return [record for _, record in read_numbered(path)]


def effective_steps(path: Path) -> dict[int, dict[str, Any]]:
    """Step -> the last record written for that step."""
    return {int(r["step"]): r for r in read(path) if "step" in r and "event" not in r}


def _objects(numbered: Any, path: Path) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for n, record in numbered:
        if isinstance(record, dict):
            out.append((n, record))
        else:
            log.warning("%s:%d: skipping a torn or malformed record", path, n)
    return out


def events(path: Path, *, whole: bool = False) -> list[tuple[int, dict[str, Any]]]:
    """Every event (a record with ``event``) with its line number, in file order: through
    the index only the event lines and the lines beyond its last segment are read
    (``whole``: the whole journal, whatever the index says).
    """
    with index.view(path) as seen:
        if seen is None or whole:
            return [(n, r) for n, r in read_numbered(path) if "event" in r]
        try:
            found: list[tuple[int, dict[str, Any]]] = list(seen.events())
            tail = _objects(seen.records(seen.tail), path)
        except index.Stale as err:
            log.info("%s: %s; reading it whole", path, err)
            return [(n, r) for n, r in read_numbered(path) if "event" in r]
        return found + [(n, r) for n, r in tail if "event" in r]


def steps_after(path: Path, step: int) -> dict[int, dict[str, Any]]:
    """Step -> the last per-step record of each step after ``step`` (what a resume from
    ``step`` redoes): through the index, only the segments that hold such a step are read."""
    numbered: list[tuple[int, Any]] | None = None
    with index.view(path) as seen:
        if seen is not None:
            try:
                numbered = [
                    pair
                    for seg in [*seen.segments, seen.tail]
                    if seg is seen.tail or (seg.high is not None and seg.high > step)
                    for pair in seen.records(seg)
                ]
            except index.Stale as err:
                log.info("%s: %s; reading it whole", path, err)
    if numbered is None:
        numbered = list(read_numbered(path))
    return {s: r for _, r in numbered if (s := index.step_of(r)) is not None and s > step}


def sealed_chain(path: Path, trust: TrustStore) -> seal.Checked:
    """The journal's events checked against their seals (:func:`.seal.check`): read
    through the index, and whole when the chain found that way breaks (an index that left
    an event out, or a journal someone wrote to)."""
    checked = seal.check(events(path), trust)
    return seal.check(events(path, whole=True), trust) if checked.stray else checked
