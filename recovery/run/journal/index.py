"""The journal's index, ``metrics.jsonl.index``: where its events lie, what steps each part holds.

The journal grows with the run (a line a step); a resume, ``recovery ls`` and the
self-check need only its events (a few per checkpoint) and the per-step records
after one checkpoint. The index lets them read those and nothing else, so what
they cost does not grow with the run.

It is a JSON-lines file beside the journal, one line per *segment*: a run of at
most :data:`SEGMENT_LINES` whole lines of the journal, appended by the journal's
writer once they are written (when the segment is full, and when the journal
closes)::

    {"v": 1, "from": 0, "to": 409731, "line": 1, "lines": 4096, "steps": [1, 4093],
     "events": [[0, 388, 1, "5d0c41e3f1e2a7b9"], ...]}

``from``/``to``: the byte offsets of its first line and past its last; ``line``:
the first line's number; ``steps``: the least and greatest step of its per-step
records (``null``: none); ``events``: each event line's offset, length (its newline
excluded), line number and BLAKE2b-64 digest.

The index is a cache, never a source of truth. A reader uses it only when its
segments follow one another from byte 0, each ends on a newline within the file,
and every event it names is there byte for byte; otherwise (no index: a journal
written before it existed; one edited by hand) it reads the whole journal, and
the writer's next start indexes the journal afresh. What follows the last
segment (the one a killed writer never indexed, lines another tool appended) is
always read whole. The events found through it are checked by their seals as
any others (:mod:`recovery.integrity.keys.seal`), and a reader that finds the
chain broken reads the whole journal again, so an index that leaves out an event
with a sealed one after it cannot hide it; leaving out the last ones hides them
as cutting the journal's tail would (the threat model's limit: nothing after
the tail authenticates it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

from recovery.format import bounded

log = logging.getLogger(__name__)

SUFFIX = ".index"
"""The index of ``metrics.jsonl`` is ``metrics.jsonl.index``."""
SEGMENT_LINES = 4096
"""Lines per segment: a resume reads about two segments of per-step records."""
VERSION = 1
MAX_INDEX_BYTES = 64 * 2**20
"""An index larger than this is not read (about 2 billion journaled steps)."""


def path_of(journal: Path) -> Path:
    """Where the index of ``journal`` lies."""
    return journal.with_name(journal.name + SUFFIX)


def digest(line: bytes) -> str:
    """The digest an index keeps of an event line (its newline excluded)."""
    return hashlib.blake2b(line, digest_size=8).hexdigest()


def step_of(record: object) -> int | None:
    """The step of a per-step record (``None``: an event, or no integer step)."""
    if not isinstance(record, dict) or "event" in record:
        return None
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


@dataclass
class Segment:
    """A run of whole lines of the journal, as one index line describes it."""

    start: int
    line: int
    end: int = -1
    lines: int = 0
    low: int | None = None
    high: int | None = None
    events: list[tuple[int, int, int, str]] = field(default_factory=list)
    """(offset, length, line number, digest) of each event line."""

    def __post_init__(self) -> None:
        if self.end < 0:
            self.end = self.start

    def add(self, line: bytes, record: object) -> None:
        """The next line (its bytes, newline excluded) and what it parsed as."""
        offset, number = self.end, self.line + self.lines
        self.end += len(line) + 1
        self.lines += 1
        if isinstance(record, dict) and "event" in record:
            self.events.append((offset, len(line), number, digest(line)))
        elif (step := step_of(record)) is not None:
            self.low = step if self.low is None or step < self.low else self.low
            self.high = step if self.high is None or step > self.high else self.high

    def following(self) -> Segment:
        """The empty segment that begins where this one ends."""
        return Segment(self.end, self.line + self.lines)

    def dumps(self) -> str:
        """Its index line (no newline)."""
        steps = None if self.low is None else [self.low, self.high]
        return json.dumps(
            {"v": VERSION, "from": self.start, "to": self.end, "line": self.line}
            | {"lines": self.lines, "steps": steps, "events": self.events},
            separators=(",", ":"),
        )

    @classmethod
    def loads(cls, line: bytes) -> Segment:
        """An index line read back.

        Raises:
            ValueError: it is not one this version writes.
        """
        try:  # its shape is checked below: no depth walk (an index line is long)
            d = json.loads(line)
        except RecursionError:
            raise ValueError("nested too deep") from None
        ints = (d["from"], d["to"], d["line"], d["lines"])
        if d.get("v") != VERSION or not all(type(i) is int for i in ints):
            raise ValueError("not a version-1 segment")
        steps = d["steps"] or [None, None]
        if steps != [None, None] and not (
            len(steps) == 2 and all(type(x) is int for x in steps) and steps[0] <= steps[1]
        ):
            raise ValueError(f"steps {steps!r} are no range of steps")
        events = [(o, n, k, h) for o, n, k, h in d["events"]]
        if not all(type(x) is int for e in events for x in e[:3]) or not all(
            type(e[3]) is str for e in events
        ):
            raise ValueError("an event entry is not (offset, length, line, digest)")
        return cls(d["from"], d["line"], d["to"], d["lines"], steps[0], steps[1], events)


class FileBytes:
    """The bytes of an open file, read (``pread``) where asked: no mapping, so a file that
    shrinks under a reader is a short read, never a SIGBUS, and a file system that cannot
    map files (FUSE with ``direct_io``) reads as any other."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, key: int) -> int: ...

    @overload
    def __getitem__(self, key: slice) -> bytes: ...

    def __getitem__(self, key: int | slice) -> int | bytes:
        if isinstance(key, slice):
            start, stop, _ = key.indices(self.size)
            return os.pread(self.fd, max(0, stop - start), start)
        at = key + self.size if key < 0 else key
        got = os.pread(self.fd, 1, at) if 0 <= at < self.size else b""
        if not got:
            raise IndexError(f"byte {key} is past the end of the file")
        return got[0]


Data = bytes | FileBytes


def lines(data: Data, start: int, end: int) -> Iterator[bytes]:
    """The lines of ``data[start:end]``, each up to a newline and without it (a last one
    without its newline too: a torn line). A line ends at ``\n`` only, in the index and in
    the whole read alike (:func:`recovery.run.journal.reading.read_numbered`)."""
    if start >= end:
        return
    chunk = bytes(data[start:end])
    parts = chunk.split(b"\n")
    if chunk.endswith(b"\n"):
        parts.pop()
    yield from parts


def parsed(line: bytes) -> object:
    """What one journal line holds (``None``: blank, torn, not UTF-8 or malformed)."""
    if not line.strip():
        return None
    try:
        return bounded.json_loads(line.decode("utf-8"))  # a BOM is malformed, as in the whole read
    except ValueError:
        return None


def mismatch(segments: list[Segment], data: Data, size: int) -> str | None:
    """Why ``segments`` do not describe the journal ``data`` of ``size`` bytes (``None``:
    they do: contiguous from byte 0, the last ending a line, every event there byte for
    byte; each segment's own ends are checked when it is read: :meth:`View.records`)."""
    at, line = 0, 1
    for seg in segments:
        if (seg.start, seg.line) != (at, line) or not at < seg.end <= size or seg.lines < 1:
            return f"a segment at byte {seg.start}, line {seg.line} does not follow the last"
        for offset, length, _, want in seg.events:
            if not seg.start <= offset < offset + length < seg.end or data[offset + length] != 0x0A:
                return f"an event at byte {offset} lies outside its segment or its line"
            if (offset and data[offset - 1] != 0x0A) or digest(
                data[offset : offset + length]
            ) != want:
                return f"the event at byte {offset} is not the one indexed"
        at, line = seg.end, seg.line + seg.lines
    if at and data[at - 1] != 0x0A:
        return f"the last segment, ending at byte {at}, does not end a line"
    return None


class Stale(Exception):
    """A segment read through the index does not lie on whole lines of the journal: the
    index is not this journal's (read it whole)."""


def segments_in(text: bytes) -> list[Segment]:
    """The segments an index file holds.

    Raises:
        ValueError: a line is no segment.
    """
    return [Segment.loads(line) for line in text.splitlines() if line.strip()]


@dataclass(frozen=True)
class View:
    """A journal seen through its index, which matches it."""

    data: Data
    segments: list[Segment]
    tail: Segment
    """What follows the last segment, to the end of the file: read whole."""

    def records(self, seg: Segment) -> Iterator[tuple[int, object]]:
        """(line number, what it parsed as) of each line of ``seg`` that is not blank.

        Raises:
            Stale: ``seg`` does not begin and end on line boundaries, or holds another
                number of lines than the index says.
        """
        try:
            starts = seg.start == 0 or self.data[seg.start - 1] == 0x0A
            ends = seg is self.tail or self.data[seg.end - 1] == 0x0A
        except (IndexError, OSError) as err:  # the journal shrank under the reader
            raise Stale(f"the segment at byte {seg.start} is past the journal ({err})") from err
        if seg is not self.tail and not (starts and ends):
            raise Stale(f"the segment at byte {seg.start} does not lie on whole lines")
        count = 0
        for n, line in enumerate(lines(self.data, seg.start, seg.end), seg.line):
            count += 1
            if line.strip():
                yield n, parsed(line)
        if seg is not self.tail and count != seg.lines:
            raise Stale(f"the segment at byte {seg.start} holds {count} lines, not {seg.lines}")

    def events(self) -> Iterator[tuple[int, dict[str, object]]]:
        """(line number, record) of each event line the segments name.

        Raises:
            Stale: a line it names is no event (its digest matched: the index lies).
        """
        for seg in self.segments:
            for offset, length, n, _ in seg.events:
                record = parsed(bytes(self.data[offset : offset + length]))
                if not isinstance(record, dict) or "event" not in record:
                    raise Stale(f"line {n}, which the index names as an event, is none")
                yield n, record


_PARSED: dict[tuple[int, int, int, int], list[Segment]] = {}
"""Index files this process parsed, by (device, inode, size, mtime): a resume reads the
index three times (its history, its self-check, its writer's start), and parses it once."""


def read_segments(fd: int) -> list[Segment]:
    """The segments of the index file open at ``fd`` (parsed once per version of the file).

    Raises:
        ValueError: it is no regular file within :data:`MAX_INDEX_BYTES`, or a line is no
            segment.
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_INDEX_BYTES:
        raise ValueError(f"not a regular file of at most {MAX_INDEX_BYTES} bytes")
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _PARSED:
        try:
            segments = segments_in(os.pread(fd, MAX_INDEX_BYTES, 0))
        except (KeyError, TypeError, IndexError) as err:
            raise ValueError(f"a line is no segment ({err!r})") from None
        if len(_PARSED) >= 8:
            _PARSED.clear()
        _PARSED[key] = segments
    return list(_PARSED[key])


def open_plain(path: Path) -> int | None:
    """``path`` opened to read, never through a symlink (nor blocking on a FIFO); ``None``:
    no such file, a link, or unreadable."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None


def _read_index(path: Path) -> list[Segment] | None:
    """The index file's segments, never through a symlink (``None``: no index file).

    Raises:
        ValueError: what :func:`read_segments` raises.
    """
    fd = open_plain(path)
    if fd is None:
        return None
    try:
        return read_segments(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def view(journal: Path) -> Iterator[View | None]:
    """``journal`` through its index while the block runs (``None``: no index that matches
    it: read the whole journal)."""
    try:
        segments = _read_index(path_of(journal))
    except ValueError as err:
        log.info("%s: not read (%s); reading the whole journal", path_of(journal), err)
        segments = None
    if segments is None:
        yield None
        return
    try:
        fh = journal.open("rb")
    except OSError as err:
        log.info("%s: not read through its index (%s)", journal, err)
        yield None
        return
    with fh:
        data = FileBytes(fh.fileno())
        try:
            why = mismatch(segments, data, len(data))
        except OSError as err:
            why = f"not read: {err}"
        if why is not None:
            log.info("%s does not match %s (%s): reading it whole", path_of(journal), journal, why)
            yield None
            return
        last = segments[-1].following() if segments else Segment(0, 1)
        yield View(data, segments, Segment(last.start, last.line, len(data)))
