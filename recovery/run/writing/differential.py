"""Differential saves: which save is a full base, which a delta, and the base held for them.

With ``checkpoint.differential.enabled`` the first save of a process, and then
every ``full_every``-th, is a full checkpoint; the saves between are *deltas*
(:mod:`recovery.format.delta`: each large table's changed rows, everything
else whole) of a *base*: with ``against: previous`` the save before (a chain,
each link holding only what changed since the last save), with ``against:
full`` the chain's full checkpoint. The base's tables are kept in host memory
(one copy, refreshed on the writer's thread as each base commits: after a delta only
the rows it found changed), so a delta
compares against exactly the bytes its base holds without reading them back.
The next full checkpoint consolidates the chain: written like any save (on the
writer's thread when saves are asynchronous), it starts a new chain, and
retention may then delete the old one. A resume adopts the chain it loaded
(:meth:`Differential.adopt`): the next save continues it.

The tracker changes only when a save commits (on the writer's thread); the
next save is decided after waiting for that one, so a decision never sees a
half-updated tracker. A failed save changes nothing: a failed base leaves the
previous base (intact on disk) in charge, and the next save is full again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from recovery.config import DifferentialConfig
from recovery.format import delta
from recovery.format.manifest import Manifest
from recovery.integrity.reads import chain
from recovery.state import snapshot

log = logging.getLogger(__name__)

Tensors = dict[str, dict[str, torch.Tensor]]


def full_due(since_base: int | None, full_every: int) -> bool:
    """Whether the next save is a full base: no base yet (``None``), or ``full_every - 1``
    deltas already hang on it."""
    return since_base is None or since_base + 1 >= full_every


@dataclass(frozen=True)
class Held:
    """A committed full checkpoint kept as the base of the deltas that follow."""

    ref: chain.Base
    tables: Tensors = field(repr=False)
    """Copies of its tables, by component and key."""
    owned: bool = True
    """``tables`` are copies of our own, which the next base may overwrite in place."""


def _tables(
    tensors: Tensors, min_bytes: int, *, copy: bool = True, reuse: Held | None = None
) -> Tensors:
    """The tensors that are compared row by row, as private host copies (never in device
    memory: a GPU run keeps its tables' copy on the host); ``copy=False`` holds them as
    they are (tensors nothing else holds or writes). ``reuse``: the previous base, whose
    copies of the same shape and dtype are overwritten in place, not allocated again
    (a fresh gigabyte costs its page faults on every new base)."""
    old = reuse.tables if reuse is not None and reuse.owned else {}
    out: Tensors = {}
    for name, ts in tensors.items():
        out[name] = {}
        for k, t in ts.items():
            if not delta.is_table(t, min_bytes):
                continue
            into = old.get(name, {}).get(k)
            if copy and into is not None and into.shape == t.shape and into.dtype == t.dtype:
                out[name][k] = into.copy_(t.detach())
            else:
                out[name][k] = t.detach().to("cpu", copy=copy)
    return out


def _refresh(plan: Plan, tensors: Tensors) -> bool:
    """Make the held tables of ``plan``'s base those of ``tensors`` (the delta just
    committed), in place: only the rows it found changed, whole the tables it wrote whole.
    ``False`` (nothing changed): the tables are not the same set, shapes and dtypes (copy
    them whole instead)."""
    assert plan.base is not None
    held, min_bytes = plan.base, plan.tracker.min_bytes
    now = {
        (n, k): t
        for n, ts in tensors.items()
        for k, t in ts.items()
        if delta.is_table(t, min_bytes)
    }
    bufs = {(n, k): b for n, ts in held.tables.items() for k, b in ts.items()}
    if (
        not held.owned
        or now.keys() != bufs.keys()
        or any(bufs[nk].shape != t.shape or bufs[nk].dtype != t.dtype for nk, t in now.items())
    ):
        return False
    # no save is in flight but this one: the held copies are free to change
    for nk, t in now.items():
        rows = plan.changed.get(nk)
        if rows is None:
            bufs[nk].copy_(t.detach())
        elif len(rows):
            values = t.detach().index_select(0, rows.to(t.device))
            bufs[nk].index_copy_(0, rows.to(bufs[nk].device), values.to(bufs[nk].device))
    return True


@dataclass(frozen=True)
class Plan:
    """How one save is written: a full base (``base`` None) or a delta of ``base``."""

    tracker: Differential = field(repr=False)
    base: Held | None
    sequence: int
    """0 for a base; the delta's place after its base (1, 2, ...)."""
    changed: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict, repr=False)
    """(component, key) -> the rows :meth:`encode` found changed in that table (a delta's)."""

    def encode(self, tensors: Tensors) -> tuple[Tensors, dict[str, Any]]:
        """The tensors to write and the ``state.json`` record (``{}`` for a base).

        A delta's record: its base (name, step, digest), sequence, and per component
        the patched tables with their changed and total rows.
        """
        if self.base is None:
            return tensors, {}
        out: Tensors = {}
        tables: dict[str, Any] = {}
        for name, ts in tensors.items():
            out[name], patched = delta.diff(
                ts, self.base.tables.get(name, {}), self.tracker.min_bytes
            )
            if patched:
                tables[name] = patched
            for key in patched:
                self.changed[name, key] = out[name][delta.ROWS + key]
        record = {"base": self.base.ref.record(), "sequence": self.sequence, "tables": tables}
        return out, record

    def committed(self, final: Path, mf: Manifest, tensors: Tensors) -> None:
        """After the commit of ``final``: the tables the next delta compares with become
        this save's (copied; after a delta of the save before, only its changed rows)."""
        self.tracker.committed(self, final, mf, tensors)


class Differential:
    """One run's differential-save state: the held base and how many deltas it has."""

    def __init__(self, cfg: DifferentialConfig) -> None:
        self.cfg = cfg
        self.min_bytes = cfg.min_bytes
        self.held: Held | None = None
        self.since: int | None = None
        """Deltas committed on the held base (``None``: no base held)."""

    def plan(self) -> Plan | None:
        """How the next save is written (``None``: differential saves are off)."""
        if not self.cfg.enabled:
            return None
        if self.held is None or full_due(self.since, self.cfg.full_every):
            return Plan(self, None, 0)
        return Plan(self, self.held, (self.since or 0) + 1)

    def committed(self, plan: Plan, final: Path, mf: Manifest, tensors: Tensors) -> None:
        """Record a committed save (see :meth:`Plan.committed`). A base whose tables cannot
        be copied (no memory) is not held: the save stays committed, and the next save is
        a full base again."""
        previous = self.cfg.against == "previous"
        if plan.base is None or previous:
            # no save is in flight but this one: the old copies are free
            try:
                if plan.base is not None and _refresh(plan, tensors):
                    tables = plan.base.tables  # the changed rows copied in place
                else:
                    tables = _tables(tensors, self.min_bytes, reuse=self.held)
            except (RuntimeError, MemoryError) as err:
                log.warning(
                    "%s: its tables were not copied (%s); the next save is full", final, err
                )
                self.forget()
                return
            self.held = Held(chain.reference(mf, final), tables)
        self.since = plan.sequence

    def forget(self) -> None:
        """Hold no base: the next save is a full one."""
        self.held = None
        self.since = None

    def adopt(
        self, run_dir: Path, verified: Any, links: Sequence[Any], decoded: snapshot.Decoded
    ) -> None:
        """After a resume: hold the chain it loaded, so the next save continues it: a
        delta of the resumed checkpoint itself (``against: previous``) or of its chain's
        full checkpoint. A checkpoint from outside ``run_dir`` (``+resume=best``, a path) is
        not adopted: the next save is a full base, since a delta finds its base beside it.

        Args:
            verified: the resumed checkpoint's :class:`~recovery.integrity.reads.reader.Verified`.
            links: a delta's verified chain of bases, the full checkpoint first (empty: full).
            decoded: the resumed checkpoint, decoded.
        """
        self.forget()
        if not self.cfg.enabled:
            return
        previous = self.cfg.against == "previous" or not links
        source = verified if previous else links[0]
        if source.path.absolute().parent.resolve() != run_dir.resolve():
            return
        chain_ = [*links, verified] if previous else links[:1]
        tensors = {name: snapshot.full_tensors(chain_, name) for name in decoded.tree}
        # the resumed tensors are about to be loaded into the live state, which may keep
        # them (an optimizer's moments): copied. A full base under a delta is held as read:
        # the state got the patched copies and the delta's own tensors, never the base's
        self.held = Held(
            chain.reference(source.manifest, source.path),
            _tables(tensors, self.min_bytes, copy=previous),
            owned=previous,
        )
        record = decoded.meta.get(snapshot.DIFFERENTIAL)  # checked when it was decoded
        self.since = int(record["sequence"]) if isinstance(record, dict) else 0
        log.info(
            "differential saves continue the chain of %s (%d deltas on it)",
            source.path.name,
            self.since,
        )
