"""The writer's side of the journal's index (:mod:`recovery.run.journal.index`): what it
appends as the journal grows, and what it indexes at its start."""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path
from typing import IO, Any

from recovery.errors import RecoveryError
from recovery.integrity import nofollow
from recovery.run.journal import index
from recovery.run.journal.index import FileBytes, Segment, lines, mismatch, parsed, path_of

log = logging.getLogger(__name__)


class Segmenter:
    """The writer's side: indexes at its start what no segment covers yet, then every
    :data:`~recovery.run.journal.index.SEGMENT_LINES` lines it writes, and the rest at its close.

    The index is a cache: a failure to write it is logged once and indexing stops (the
    readers read the unindexed rest whole), never the run's failure.
    """

    def __init__(self, journal: Path) -> None:
        self.path = path_of(journal)
        self._fh: IO[str] | None = None
        self._open: Segment | None = None

    def start(self, fd: int) -> None:
        """Index what the journal open at ``fd`` (ending on a newline) holds beyond the index."""
        try:
            self._fh = nofollow.open_append(self.path, "the journal's index")
            self._open = self._catch_up(FileBytes(fd))
        except (OSError, RecoveryError) as err:
            self._stop(err)

    def _catch_up(self, data: index.Data) -> Segment:
        assert self._fh is not None
        try:
            segments = index.read_segments(self._fh.fileno())
            why = mismatch(segments, data, len(data))
        except ValueError as err:
            why = f"not read: {err}"
        if why is not None:
            if os.fstat(self._fh.fileno()).st_size:
                log.info("%s: %s; indexing the journal afresh", self.path, why)
            os.ftruncate(self._fh.fileno(), 0)
            segments = []
        seg = segments[-1].following() if segments else Segment(0, 1)
        for line in lines(data, seg.start, len(data)):
            seg.add(line, parsed(line))
            if seg.lines == index.SEGMENT_LINES:
                seg = self._close(seg)
        return self._close(seg) if seg.lines else seg

    def _close(self, seg: Segment) -> Segment:
        assert self._fh is not None
        # one write straight to the file (O_APPEND): nothing is left in a buffer that a
        # failed write (a full disk) would try to write again at close
        line = (seg.dumps() + "\n").encode()
        if os.write(self._fh.fileno(), line) != len(line):
            raise OSError(errno.EIO, "a short write of the journal's index")
        return seg.following()

    def wrote(self, line: str, record: dict[str, Any]) -> None:
        """The journal's writer appended ``line`` (its newline included) holding ``record``."""
        seg = self._open
        if seg is None:
            return
        step = record.get("step")
        if "event" not in record and type(step) is int:
            # the common case, a per-step record: its length (json.dumps writes ASCII, so a
            # character is a byte) and its step, no copy of the line
            seg.end += len(line)
            seg.lines += 1
            seg.low = step if seg.low is None or step < seg.low else seg.low
            seg.high = step if seg.high is None or step > seg.high else seg.high
        else:
            seg.add(line[:-1].encode(), record)
        if seg.lines == index.SEGMENT_LINES:
            try:
                self._open = self._close(seg)
            except OSError as err:
                self._stop(err)

    def close(self) -> None:
        """Index the lines written since the last segment, and close the index."""
        try:
            if self._open is not None and self._open.lines:
                self._close(self._open)
        except OSError as err:
            self._stop(err)
        self._open = None
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _stop(self, err: Exception) -> None:
        log.warning(
            "%s: cannot write the journal's index (%s); resumes read the journal beyond it "
            "whole (slower, as correct)",
            self.path,
            err,
        )
        self._open = None


def catch_up(journal: Path) -> None:
    """Index what no segment of ``journal``'s index covers yet (a journal written before
    the index existed, a killed writer's last lines), so that every read after it goes
    through the index: a resume's history, its self-check, its writer's start. Only the
    journal's writer calls it, under the run's lock, before it reads. A journal whose last
    line is torn is left to the writer's start, which ends that line first."""
    fd = index.open_plain(journal)
    if fd is None:
        return  # none yet, or a link: the writer's open says so
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not st.st_size:
            return
        if os.pread(fd, 1, st.st_size - 1) != b"\n":
            return
        segmenter = Segmenter(journal)
        segmenter.start(fd)
        segmenter.close()
    finally:
        os.close(fd)
