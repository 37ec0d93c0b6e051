"""A ``torchrun`` job's save strategies: :class:`Ranks` (every rank writes its shards, rank
0 commits) and :class:`RanksBackground` (the same protocol on a background thread per
rank). Chosen by :func:`recovery.run.writing.strategies.choose`."""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recovery.format.manifest import FileRecord
from recovery.integrity.keys.signing import Signer
from recovery.parallel import multirank, sharded
from recovery.parallel import world as distributed
from recovery.parallel.collectives import WORLD, Collectives, Group
from recovery.parallel.world import World
from recovery.run.writing.background import BackgroundWriter
from recovery.run.writing.job import SaveJob, Tensors, split
from recovery.run.writing.oneprocess import Committed, Inline
from recovery.run.writing.staging import Staging
from recovery.state.registry import TrainState


class Ranks(Inline):
    """Every rank writes its shards (:mod:`recovery.parallel.multirank`); rank 0 writes the
    replicated components beside them, lists and signs every file, and commits; then all
    ranks learn the outcome together."""

    def __init__(self, signer: Signer, committed: Committed, world: World, strategy: str) -> None:
        super().__init__(signer, committed)
        self.world = world
        self.strategy = strategy

    def save(self, job: SaveJob, state: TrainState, *, waited: float, sync: bool = False) -> float:
        """Write ``job`` on every rank; commit on rank 0; return the seconds it took.

        Raises:
            CommitError: some rank failed; the step is abandoned on every rank.
        """
        started = time.perf_counter()
        replicated = split(self._replicated(state))
        self.commit_parts(
            job, multirank.live_parts(state), replicated, started, waited, mode="sync"
        )
        return time.perf_counter() - started

    def _replicated(self, state: TrainState) -> dict[str, Any]:
        """The components rank 0 writes for every rank (none on the others)."""
        if not self.world.leader:
            return {}
        return {n: c.state_dict() for n, c in state.components.items() if n not in sharded.SHARDED}

    def commit_parts(
        self,
        job: SaveJob,
        parts: multirank.Parts,
        replicated: tuple[dict[str, Any], Tensors],
        started: float,
        waited: float,
        *,
        mode: str,
        pause: float | None = None,
        comm: Collectives = WORLD,
    ) -> None:
        """The protocol, every collective over ``comm``; rank 0 adds ``replicated`` (skeletons,
        tensors) and commits."""

        def leader(tmp: Path, adopt: Sequence[str | FileRecord], meta: dict[str, Any]) -> None:
            skeletons, tensors = replicated
            self._write(
                job,
                skeletons,
                tensors,
                started,
                waited,
                mode=mode,
                pause=pause,
                tmp=tmp,
                adopt=adopt,
                extra_meta=meta,
            )

        multirank.save(
            parts, job.final, self.world, job.step, strategy=self.strategy, commit=leader, comm=comm
        )
        self.persisted = job.step  # every rank: rank 0 said it committed


class RanksBackground(Ranks):
    """Under ``torchrun`` with ``checkpoint.async``: :class:`Ranks`' protocol, run on a
    background thread per rank from reused staging buffers, as :class:`Background` runs
    a single process's.

    Each rank's pause: DCP's view of model and optimizer, its RNG streams, and
    the copy of its DCP tensors (its FSDP2 shards, or DDP's replicated
    tensors) and, on rank 0, of the replicated components into the reused
    buffers. Every rank stages the same step (the save decision is
    collective): one consistent snapshot. The threads run the protocol over a
    gloo group of their own (:class:`~recovery.parallel.collectives.Group`,
    created here: collective), so their collectives never interleave with the
    training thread's; rank 0 renames only after every rank agreed, so a rank
    killed mid-save commits nothing. At most one save is in flight: the next
    save, a preemption's save and :meth:`close` wait for it.
    """

    def __init__(self, signer: Signer, committed: Committed, world: World, strategy: str) -> None:
        super().__init__(signer, committed, world, strategy)
        self._writer = BackgroundWriter()
        self._staging = Staging()
        self._group = Group.create(distributed.timeout())

    def save(self, job: SaveJob, state: TrainState, *, waited: float, sync: bool = False) -> float:
        """Stage ``state`` and write in the background; ``sync`` writes inline (preemption).

        The caller has waited for the previous save (:meth:`wait`): the buffers are free.
        """
        if sync:
            return super().save(job, state, waited=waited)
        started = time.perf_counter()
        live = multirank.live_parts(state)
        tensors = self._staging.stage_tree(live.tensors, "dcp")
        staged = self._staging.stage(self._replicated(state))  # also waits for the copies
        parts = multirank.Parts(live.own, tensors, copy.deepcopy(live.groups))
        replicated = (staged.skeletons, staged.tensors)
        pause = time.perf_counter() - started

        def run() -> Any:
            begun = time.perf_counter()
            self.commit_parts(
                job, parts, replicated, begun, waited, mode="async", pause=pause, comm=self._group
            )
            return job.final

        self._writer.submit(run)
        return pause

    def wait(self) -> float:
        """As :meth:`Background.wait`: the save in flight, on this rank's thread."""
        return self._writer.wait()

    def close(self) -> float:
        """As :meth:`Background.close`: the save in flight, then this rank's thread stops."""
        return self._writer.close()

    def status(self) -> tuple[bool, bool]:
        """This rank's ``(failed, running)`` while a save is out (the same on every rank)."""
        if not self._writer.outstanding:
            return False, False
        running = self._writer.busy  # first: once seen done, `failed` is final
        return self._writer.failed, running

    def settle(self, *, failed: bool, running: bool) -> None:
        """Raise a failed background save on every rank at the same step.

        Ranks learn of a failure moments apart, and one raising a step before
        another would leave that one in a collective with a rank that is gone.
        So while a save is out the ranks compare notes in the checkpointer's
        per-step collective (no collective of its own): if any rank's failed, or
        none is still running, every rank collects its own (a failure is agreed:
        it fails on all).

        Raises:
            CommitError, StorageError (a full disk): the save in flight failed.
        """
        if self._writer.outstanding and (failed or not running):
            self.wait()

    def raise_if_failed(self) -> None:
        """Not on its own under torchrun: every rank must raise at the same step
        (:meth:`settle`, given the ranks' :meth:`status`)."""
