"""The journal's writer: :class:`Journal` appends records, seals the steering ones and
shows them to watchers and observers (the package's docstring says what each is)."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import IO, Any, Protocol

from recovery.integrity import nofollow
from recovery.integrity.commits import full
from recovery.integrity.keys import seal
from recovery.integrity.keys.signing import Signer, TrustStore
from recovery.run.journal.reading import sealed_chain
from recovery.run.journal.segmenter import Segmenter

log = logging.getLogger(__name__)

_ENCODER = json.JSONEncoder(separators=(",", ":"))
"""One encoder for every line (``json.dumps`` with arguments builds one per call); ASCII
only (``ensure_ascii``), so a line's characters are its bytes (the index counts on it)."""

BEGIN_EVENTS = ("start", "warm_start", "resume")
"""The events a process journals when its run begins (fresh, warm-started, resumed)."""


class Observer(Protocol):
    """Sees every record after it is written (or discarded), and the journal's close."""

    def seen(self, record: dict[str, Any]) -> None: ...

    def closed(self) -> None: ...


class Watcher(Protocol):
    """Sees each per-step record: adds fields before it is written, observes it after."""

    def annotate(self, record: dict[str, Any]) -> dict[str, Any]: ...

    def observed(self, record: dict[str, Any]) -> None: ...


def is_step(record: dict[str, Any]) -> bool:
    """A per-step record: it has a ``step`` and is no event."""
    return "step" in record and "event" not in record


class Journal:
    """Appends records to a JSON-lines file (``path=None``: discards them, for ranks > 0).

    The file (and its directory) is created by the first record, so a run that
    fails before it records anything leaves nothing behind. Watchers see the
    per-step records on every rank, written or discarded.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._fh: IO[str] | None = None
        self._lock = threading.Lock()  # background saves record their costs too
        self._closed = False
        self._closing = False
        self._watchers: list[Watcher] = []
        self._observers: list[Observer] = []
        self._sealer: tuple[Signer, TrustStore] | None = None
        self._tip = ""  # the link of the last sealed event in the file ("": none)
        self._tip_known = False  # read from the file, or handed over by who read it
        self._index = Segmenter(path) if path is not None else None

    def seal_with(self, signer: Signer, trust: TrustStore) -> None:
        """Seal the steering events written from now on with ``signer``, chained onto the
        last one in the file that verifies with ``trust`` (:mod:`recovery.integrity.keys.seal`)."""
        self._sealer = (signer, trust)

    def chain_from(self, tip: str) -> None:
        """Chain the next sealed event onto ``tip``: the last sealed event that verifies, as
        the caller found it reading this very file under the writer's lock with the same
        trust store (a resume: :func:`recovery.run.restoring.history.read`), so the first
        sealed write need not read the whole file again."""
        with self._lock:
            if not self._tip_known:
                self._tip, self._tip_known = tip, True

    def watch(self, watcher: Watcher) -> None:
        """Show ``watcher`` every per-step record from now on."""
        self._watchers.append(watcher)

    def tap(self, observer: Observer) -> None:
        """Show ``observer`` every record from now on (per-step records and events, as
        written, without their seals), and :meth:`close`. Unlike a watcher it cannot
        change a record, and an exception it raises drops it (a warning) instead of
        reaching the writer."""
        self._observers.append(observer)

    def _tell(self, call: str, *args: Any) -> None:
        for observer in list(self._observers):
            try:
                getattr(observer, call)(*args)
            except Exception as err:  # an observer's failure never reaches the run
                log.warning("journal observer %r failed and is dropped: %s", observer, err)
                self._observers = [o for o in self._observers if o is not observer]

    def unwatch(self, watcher: Watcher) -> None:
        """Stop showing ``watcher`` the per-step records."""
        self._watchers = [w for w in self._watchers if w is not watcher]

    def step(self, step: int, **fields: Any) -> None:
        """Write the per-step record of optimizer step ``step`` (``loss=``, ``lr=``, ...)."""
        self.write({"step": step, **fields})

    def _open(self, path: Path) -> IO[str]:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = nofollow.open_append(path, "the run's journal")
        size = os.fstat(fh.fileno()).st_size
        if size > 0 and os.pread(fh.fileno(), 1, size - 1) != b"\n":
            fh.write("\n")
            fh.flush()
        if self._index is not None:
            self._index.start(fh.fileno())
        return fh

    def _sealed(self, record: dict[str, Any]) -> dict[str, Any]:
        # under self._lock: the chain is one sequence whichever thread writes
        if self._sealer is None or self.path is None or not seal.steers(record):
            return record
        signer, trust = self._sealer
        if not self._tip_known:
            tip = sealed_chain(self.path, trust).tip if self.path.is_file() else ""
            self._tip, self._tip_known = tip, True
        sealed = seal.seal(record, self._tip, signer)
        self._tip = seal.link(sealed)
        return sealed

    def write(self, record: dict[str, Any]) -> None:
        """Append one record and flush it to the OS (safe from several threads).

        A per-step record (:func:`is_step`) is first shown to the watchers, whose
        fields it gains where it lacks them, and after the write observed by them.
        """
        if self._closed:
            return
        watchers = list(self._watchers) if is_step(record) else []
        for watcher in watchers:
            extra = watcher.annotate(record)
            record = {**record, **{k: v for k, v in extra.items() if k not in record}}
        if self.path is not None:
            with self._lock:
                try:
                    if self._fh is None:
                        self._fh = self._open(self.path)
                    line = _ENCODER.encode(self._sealed(record)) + "\n"
                    self._fh.write(line)
                    self._fh.flush()
                    if self._index is not None:
                        self._index.wrote(line, record)
                except OSError as err:
                    if (no_room := full.cause(err)) is None:
                        raise
                    raise full.refused(no_room, self.path.parent) from err
        for watcher in watchers:
            watcher.observed(record)
        self._tell("seen", record)

    def close(self) -> None:
        """The observers see the end (once), then the file is closed: what an observer still
        records as it ends (a tracker's run id) is written."""
        with self._lock:
            was_closing, self._closing = self._closing, True
        if was_closing:
            return
        self._tell("closed")
        with self._lock:
            self._closed = True
            if self._fh is not None:
                self._fh.close()
            if self._index is not None:
                self._index.close()
