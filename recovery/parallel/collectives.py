"""The collectives of the checkpoint protocol, over the job's group or a group of their own.

The save protocol (:mod:`recovery.parallel.multirank`) needs four collectives:
agree that every rank succeeded, broadcast an int and a short text from rank
0, and gather a text from every rank. On the training thread they run over
the job's default group (:data:`WORLD`, :mod:`recovery.parallel.world`). A
save written in the background (:class:`recovery.run.writing.strategies.RanksBackground`) runs
them over a gloo :class:`Group` created for it, so that its collectives
never interleave with the training thread's (DDP's all-reduces, FSDP2's
all-gathers, the per-step save decision): two threads issuing collectives on
one group in different orders on different ranks would deadlock or mix
their tensors. Like :mod:`recovery.parallel.world`, every collective carries
plain integers in a tensor, never a pickled object.

Rejected: sharing the default group under a lock. The order in which the
two threads take the lock differs across ranks, which is the deadlock again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

import torch.distributed as dist

from recovery.parallel import world as distributed


class Collectives(Protocol):
    """What the save protocol calls; a world of one answers each call itself."""

    @property
    def process_group(self) -> dist.ProcessGroup | None:
        """The group DCP's own collectives use (``None``: the default group)."""
        ...

    def all_ok(self, ok: bool) -> bool:
        """True only if ``ok`` on every rank."""
        ...

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank."""
        ...

    def broadcast_text(self, text: str) -> str:
        """Rank 0's ``text`` (ASCII, at most 64 bytes) on every rank."""
        ...

    def gather_text(self, text: str) -> list[str]:
        """Every rank's ``text`` (UTF-8), in rank order, on every rank."""
        ...


class Group:
    """The collectives over one process group of every rank (``None``: the job's own)."""

    def __init__(self, pg: dist.ProcessGroup | None) -> None:
        self._pg = pg

    @classmethod
    def create(cls, timeout: timedelta | None = None) -> Group:
        """A new gloo group over every rank (collective: every rank calls it, in the same
        order as its other ``new_group`` calls). Gloo whatever the job's backend: the
        background thread carries host tensors (staged buffers, digests), and a
        host-side group keeps its traffic off the accelerator's communicator.

        Args:
            timeout: how long a collective waits for a missing rank (the job's,
                :func:`recovery.parallel.world.timeout`; ``None``: torch's default for
                gloo, 30 minutes; a rank that died breaks it at once).
        """
        return cls(dist.new_group(backend="gloo", timeout=timeout))

    @property
    def process_group(self) -> dist.ProcessGroup | None:
        return self._pg

    def all_ok(self, ok: bool) -> bool:
        return distributed.all_ok(ok, group=self._pg)

    def broadcast_int(self, value: int) -> int:
        return distributed.broadcast_int(value, group=self._pg)

    def broadcast_text(self, text: str) -> str:
        return distributed.broadcast_text(text, group=self._pg)

    def gather_text(self, text: str) -> list[str]:
        return distributed.gather_text(text, group=self._pg)


WORLD: Collectives = Group(None)
"""The collectives of the training thread: the job's default group."""
