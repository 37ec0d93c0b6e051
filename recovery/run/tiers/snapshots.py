"""The local tier of one rank: snapshots into node-local RAM, and their promotion.

The policy and the design are in :mod:`recovery.run.tiers.rules`; this is the part
that writes. :meth:`LocalTier.snapshot` commits a step's
:class:`~recovery.run.writing.job.SaveJob` into the local directory on the training
thread (its pause); :meth:`LocalTier.save` does so and then promotes the snapshot
to the run directory on a background thread (:mod:`recovery.run.tiers.copying`:
its files copied; under ``torchrun`` :mod:`recovery.run.tiers.collective`: every
rank's, collectively), reporting the persistent commit to the ``committed`` callback
it was given (:class:`~recovery.run.saving.aftercommit.AfterCommit`), as a background
save does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recovery.config import LocalConfig
from recovery.errors import RecoveryError, SignatureError
from recovery.format.layout import RANK_SNAPSHOT, step_dir_name
from recovery.integrity.commits import commit
from recovery.integrity.keys.signing import Signer, TrustStore
from recovery.integrity.reads import listed
from recovery.parallel.world import SINGLE, World
from recovery.run.tiers import collective, peers, room, rules
from recovery.run.tiers.collective import RankPromotion
from recovery.run.tiers.copying import FilePromotion, Then
from recovery.run.tiers.directory import LocalDir
from recovery.run.tiers.peers import Peers
from recovery.run.writing import job as job_mod
from recovery.run.writing.background import BackgroundWriter
from recovery.run.writing.job import SaveJob, Tensors, split
from recovery.run.writing.staging import Staging
from recovery.run.writing.strategies import Committed, Ranks
from recovery.state.registry import TrainState

log = logging.getLogger(__name__)

Event = Callable[[dict[str, Any]], None]


class LocalTier(LocalDir):
    """One rank's local snapshots of a run directory, and their promotion to it."""

    def __init__(
        self,
        cfg: LocalConfig,
        run_dir: Path,
        *,
        rank: int,
        signer: Signer,
        committed: Committed,
        event: Event,
        async_save: bool = False,
        world: World = SINGLE,
        ranks: Ranks | None = None,
    ) -> None:
        super().__init__(cfg.root, run_dir, rank)
        self.every = cfg.every_steps
        self.run_dir = run_dir
        self.signer = signer
        self.committed = committed
        self.event = event
        self._writer = BackgroundWriter()
        """Promotions, one at a time."""
        self._snapshots = BackgroundWriter() if async_save else None
        """Snapshot writes from :attr:`_staging` (``checkpoint.async``), one at a time."""
        self._staging = Staging() if async_save else None
        self._pinned = rules.Pins()
        self.snapshot_bytes = 0
        """The newest snapshot's size (0: none committed yet)."""
        self._rechecked = False
        """Whether the RAM check ran again against a committed snapshot's real size."""
        self.skipped = 0
        """Snapshots skipped since the last one was taken (:meth:`busy`)."""
        self.world = world
        self.peers = Peers(cfg, self.dir.parent, world) if world.distributed else None
        """Under ``torchrun``: the copies of snapshots on peers
        (:mod:`recovery.run.tiers.peers`)."""
        self.promotion: FilePromotion | RankPromotion = (
            RankPromotion(ranks, signer, self._writer, self._pinned)
            if world.distributed and ranks
            else FilePromotion(signer, committed, self.check, self._writer, self._pinned)
        )
        """Copies of a snapshot's files, or under ``torchrun`` every rank's collective save
        from its snapshot (:mod:`recovery.run.tiers.collective`)."""

    def due(self, step: int) -> bool:
        """Whether ``step`` is a local snapshot's step."""
        return step > 0 and step % self.every == 0

    def busy(self) -> bool:
        """Whether the previous snapshot is still being written (``checkpoint.async``): a
        snapshot due now is skipped (:attr:`skipped`) rather than waited for, unless it is to
        be promoted. The training thread never waits for a write into RAM."""
        return self._snapshots is not None and self._snapshots.busy

    def prepare(self) -> None:
        """As :meth:`LocalDir.prepare <recovery.run.tiers.directory.LocalDir.prepare>`, and under
        ``torchrun`` the directories of the peers' copies as well."""
        super().prepare()
        if self.peers is not None:
            self.peers.prepare(self.root)

    def candidates(self, trust: TrustStore, allow_untrusted: bool) -> list[tuple[int, Path]]:
        """The snapshots a ``latest`` resume may take, oldest first: this directory's (not
        verified yet); under ``torchrun`` the job's newest step every rank holds, brought
        here from a peer if this node lost it (:meth:`~recovery.run.tiers.peers.Peers.gather`:
        collective)."""
        if self.peers is None:
            return peers.single(self.held(), trust, allow_untrusted)
        return self.peers.gather(self.dir, trust, allow_untrusted)

    def abandon(self) -> None:
        """A refused start: wait for what runs in the background (its failure is the refusal's
        to tell), then remove the empty directories :meth:`prepare` made."""
        with contextlib.suppress(RecoveryError, OSError):
            self.close(None)
        if self._private is not None:
            self._private.remove_made()

    def start(
        self,
        state: TrainState,
        step: int,
        *,
        resumed: Path | None,
        root: str | None,
        trust: TrustStore,
        allow_untrusted: bool,
    ) -> bool:
        """At the run's first step ``step``: discard snapshots of another branch, check
        that :data:`~recovery.run.tiers.rules.HELD` snapshots fit, and say what they reserve.
        Then a run ``resumed`` from a local snapshot promotes it in the background (unless its
        step is in the run directory already): the state it recovered becomes durable, and
        a run resumed at its last step still ends with that step persistent. ``root``: the
        digest the resume verified, which the snapshot must still have.

        Returns:
            Whether the snapshot resumed from is persistent already: the run directory holds
            its step, signed, with the same root digest (its promotion committed before the
            process died).

        Raises:
            StorageError: they do not fit (one line, before the first step).
            VerificationError: the snapshot resumed from changed since it was read.
        """
        self.check()
        for path in rules.newer(self.held(), step):
            log.warning(
                "removing local snapshot %s: newer than step %d the run starts at", path, step
            )
            commit.discard(path)
        if self.peers is not None:
            self.peers.adopt(resumed, self.dir)  # ranks that moved: into their own directory
            self.peers.tidy(step)
        promotion = self.promotion
        nbytes = peers.nbytes(state)
        # a fresh run's optimizer state is not there yet: checked again after the first
        # snapshot (:meth:`_recheck`); the staging buffers are another copy in RAM, and so
        # is a snapshot a promotion under torchrun reads back
        extra = (self._staging is not None) + isinstance(promotion, RankPromotion)
        room.agreed(
            self.peers,
            lambda: self.reserve(
                nbytes,
                room.freeable(self.peers, self.held()),
                staging=nbytes * extra,
                copies=room.copies(self.peers),
                every=self.every,
                event=self.event,
            ),
        )
        final = self.run_dir / step_dir_name(step)
        if isinstance(promotion, RankPromotion):  # every rank's own snapshot, now in its dir
            # resumed from this node's RAM (a rank's or a copy: adopt moved it into its dir)
            here = resumed is not None and resumed.parent.parent == self.dir.parent
            mine = self.dir / step_dir_name(step) if here else None
            source = collective.Source(trust, allow_untrusted)
            return promotion.start(state, mine, final, root=root, source=source)
        if resumed is None or resumed.parent != self.dir:
            return False
        if final.exists():  # persistent: the same files, and not a local snapshot copied there
            with contextlib.suppress(RecoveryError):
                there = listed.read_manifest(final, trust, allow_untrusted=allow_untrusted)
                return there.root == root and there.recovery.get("tier") != rules.LOCAL
            return False
        mf = listed.read_manifest(resumed, trust, allow_untrusted=allow_untrusted)
        if mf.root != root:
            raise SignatureError(
                f"{resumed}: its manifest changed since the resume verified it (root "
                f"{mf.root}, expected {root}); not promoting it. Requeue the run.",
                path=resumed,
            )
        promotion.submit(job_mod.resumed(final, mf), resumed, mf, pause=0.0, waited=0.0)
        return False

    def snapshot(
        self,
        job: SaveJob,
        state: TrainState,
        *,
        then: Then | None = None,
        view: dict[str, Any] | None = None,
    ) -> float:
        """Snapshot ``job``'s step into the local directory; return the seconds the training
        thread spent. Once it is committed (older snapshots retired), ``then(path, manifest,
        pause)`` runs.

        ``job`` is the step's save as the persistent tier would write it; the snapshot is
        the same job, under the local directory, its statement saying ``tier: local``. With
        ``checkpoint.async`` the training thread only copies the state into reused host
        buffers (:class:`~recovery.run.writing.staging.Staging`; after waiting for the previous
        snapshot's write, not for a promotion) and the write runs on a background thread.

        Raises:
            PurposeError, CommitError, StorageError (the local root is full): this snapshot
                (inline) or the previous one (async) failed.
        """
        started = time.perf_counter()
        local = dataclasses.replace(
            job,
            final=self.dir / step_dir_name(job.step),
            statement={**job.statement, "tier": rules.LOCAL},
            chained=False,
            faults_as="local",
            differential=None,
        )
        if self.world.distributed:  # whose snapshot, of which job: a resume checks both
            local = dataclasses.replace(
                local,
                statement={**local.statement, "rank": self.world.rank},
                meta={**local.meta, RANK_SNAPSHOT: peers.owner(self.world)},
            )
        skipped, self.skipped = self.skipped, 0
        if self._staging is None or self._snapshots is None:
            self._recheck()
            skeletons, tensors = split(self._tree(state, view))
            self._commit(local, skeletons, tensors, started, then)
            return time.perf_counter() - started
        self._snapshots.wait()  # the buffers are free once the previous write committed
        self._recheck()
        staged = self._staging.stage(self._tree(state, view))
        pause = time.perf_counter() - started

        def run() -> Path:
            self._commit(
                local, staged.skeletons, staged.tensors, started, then, pause=pause, skipped=skipped
            )
            return local.final

        self._snapshots.submit(run)
        return pause

    def _commit(
        self,
        local: SaveJob,
        skeletons: dict[str, Any],
        tensors: Tensors,
        started: float,
        then: Then | None,
        *,
        pause: float | None = None,
        skipped: int = 0,
    ) -> None:
        self.check()
        mf = local.write(skeletons, tensors, signer=self.signer)
        if self.peers is None:
            self._retire(local.step)
        write_s = time.perf_counter() - started
        self.snapshot_bytes = sum(r.size for r in mf.files)
        self.event(
            {
                "event": "snapshot",
                "tier": rules.LOCAL,
                "step": local.step,
                "pause_s": write_s if pause is None else pause,
                "write_s": write_s,
                "bytes": self.snapshot_bytes,
                "path": str(local.final),
                **({"skipped": skipped} if skipped else {}),
            }
        )
        if then is not None:
            then(local.final, mf, write_s if pause is None else pause)
        if self.peers is not None:  # older ones retire once the peers hold this one
            step = local.step
            self.peers.replicate(step, local.final, self._pinned, lambda: self._retire(step))

    def _retire(self, newest: int) -> None:
        """Delete the snapshots older than ``newest`` (committed) but those ``_pinned``."""
        try:
            self.check()  # never delete through a directory swapped in since
        except RecoveryError as err:
            log.warning("not retiring older local snapshots: %s", err)
            return
        for path in rules.retire(self.held(), newest, self._pinned):
            commit.discard(path)

    def save(self, job: SaveJob, state: TrainState, *, waited: float) -> float:
        """Snapshot ``job``'s step locally, then promote it to ``job.final`` in the background;
        return the seconds the training thread spent (the snapshot's). The caller has waited
        for the previous promotion (:meth:`wait`)."""
        if not isinstance(self.promotion, RankPromotion):
            return self.snapshot(job, state, then=self.promotion.then(job, waited=waited))
        started = time.perf_counter()
        view, then = self.promotion.taking(job, state, waited=waited)
        return time.perf_counter() - started + self.snapshot(job, state, then=then, view=view)

    def _tree(self, state: TrainState, view: dict[str, Any] | None) -> dict[str, Any]:
        """What a snapshot holds: the state's tree; under ``torchrun`` a rank's
        (:func:`recovery.run.tiers.peers.tree`, from ``view`` when it was taken already)."""
        return peers.tree(state, view) if self.world.distributed else state.state_dict()

    def wait(self) -> float:
        """Wait for the snapshot write and the promotion in flight (in that order: the one
        starts the other); return the seconds waited.

        Raises:
            CommitError, StorageError, VerificationError: one failed.
        """
        waited = self._snapshots.wait() if self._snapshots is not None else 0.0
        waited += self.peers.wait() if self.peers is not None else 0.0
        return waited + self._writer.wait()

    def failed(self) -> bool:
        """Whether a snapshot write, a promotion or a copy to peers finished and failed (its
        error not raised yet)."""
        done = [self._writer.failed, self.peers is not None and self.peers.failed()]
        return any(done) or (self._snapshots is not None and self._snapshots.failed)

    def raise_if_failed(self) -> None:
        """Raise a finished snapshot write's or promotion's failure, once."""
        if self._snapshots is not None:
            self._snapshots.raise_if_failed()
        if self.peers is not None:
            self.peers.raise_if_failed()
        self._writer.raise_if_failed()

    def close(self, persisted: int | None) -> float:
        """Wait for the promotion in flight and stop its thread; when the newest snapshot's
        step is persistent (``persisted``: the newest step committed in the persistent tier,
        not merely submitted), remove the local directory. Returns the seconds waited.

        Raises:
            CommitError, StorageError, VerificationError: the last promotion failed (the
                snapshots are kept).
        """
        started = time.perf_counter()
        try:
            try:
                if self._snapshots is not None:
                    self._snapshots.close()
            finally:
                self._writer.close()
            # only a step that reached the persistent tier lets the snapshots go: after a
            # failed promotion or snapshot write they can be the newest state's only copy
            held = self.held()
            done = persisted is not None and (not held or held[-1][0] <= persisted)
            if self.peers is not None:
                self.peers.close(remove=done)
            if done:
                self._remove()
        finally:
            if self._private is not None:
                self._private.close()
        return time.perf_counter() - started

    def _recheck(self) -> None:
        """Once a snapshot committed, the RAM check again with its real size (a fresh run's
        optimizer state only exists after its first step), before another is written.

        Raises:
            StorageError: it does not fit.
        """
        if self._rechecked or not self.snapshot_bytes:
            return
        self._rechecked = True
        # a promotion under torchrun reads a snapshot back: a copy not in memory yet
        reads = self.snapshot_bytes if isinstance(self.promotion, RankPromotion) else 0
        size, held = self.snapshot_bytes, room.freeable(self.peers, self.held())
        copies = room.copies(self.peers)
        room.agreed(  # every rank snapshots the same steps: all check here, all refuse
            self.peers, lambda: rules.fit(self.dir, size, held, staging=reads, copies=copies)
        )
