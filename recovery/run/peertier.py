"""The local tier under ``torchrun``: each rank's snapshots copied to peers, and the restore
of a whole job's local step from what its nodes still hold (issue 30, part 4).

Under ``torchrun`` (``dist.strategy=ddp``) a rank's local snapshot is a continuation
checkpoint of what that rank holds (the replicated model and optimizer, its own RNG
streams, the data position), written by :class:`~recovery.run.localtier.LocalTier` into
``rank<r>/`` of its node's run directory in RAM, its statement saying ``rank`` and
``world_size``. Once it commits, a background thread sends it over a gloo group of its own
to ``checkpoint.local.replicas`` peers (:func:`recovery.parallel.replicas.offsets`: by
default the same local rank of the next node), and receives theirs into
``replica-rank<s>/``; every rank takes part in every round (the ranks snapshot the same
steps), a round waits for the previous one, and a snapshot being sent is kept until it
has been. Each node keeps the newest copy of each peer's snapshot (and the one arriving).

A restarted job (``+resume=latest``) lists what every node holds (signed manifests of
this job's world size, verified), takes the newest step whose every rank's snapshot is
held somewhere (:func:`recovery.parallel.replicas.newest_complete`), has each one held
only on another node sent to its rank, and lets that rank's resume verify it (signature,
every digest) like any snapshot; if any rank's does not verify, every rank passes that
step over together. The persistent tier under ``torchrun`` is written as before, by every
rank collectively at its own steps, not promoted from the snapshots.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from recovery.config import LocalConfig
from recovery.errors import RecoveryError
from recovery.format.layout import scan, step_dir_name
from recovery.integrity import commit, listed, private
from recovery.integrity.signing import TrustStore
from recovery.parallel import replicas, transfer
from recovery.parallel import world as distributed
from recovery.parallel.collectives import Group
from recovery.parallel.world import World
from recovery.run import tiers
from recovery.run.writer import BackgroundWriter

log = logging.getLogger(__name__)


class Peers:
    """One rank's share of the job's peer replicas. Built on every rank at once (it creates
    a process group: collective)."""

    def __init__(self, cfg: LocalConfig, node_dir: Path, world: World) -> None:
        self.world = world
        self.node_dir = node_dir
        """The run's directory on this node (``rank<r>/`` and ``replica-rank<s>/`` in it)."""
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        space = replicas.spacing(cfg.replica_spacing, per_node)
        one_node = cfg.replica_spacing == 0 and per_node >= world.size
        if one_node and cfg.replicas:  # no other node to hold a copy: a lost node is the job
            log.info("local tier: every rank on one node: no peer replicas")
        wanted = 0 if one_node else cfg.replicas
        self.offsets = replicas.offsets(wanted, space, world.size) if wanted else []
        self.sources = replicas.sources(world.rank, world.size, self.offsets)
        self.destinations = replicas.destinations(world.rank, world.size, self.offsets)
        self._group = Group.create(distributed.timeout()) if self.offsets else None
        self._writer = BackgroundWriter()
        self._dirs: list[private.PrivateDir] = []

    def replica_dir(self, source: int) -> Path:
        """Where this node keeps the copies of rank ``source``'s snapshots."""
        return self.node_dir / replicas.replica_name(source)

    def prepare(self, root: Path) -> None:
        """Make or check the directories the copies arrive in (as the rank's own: this
        user's, 0700) and remove what interrupted receipts left."""
        for source in self.sources:
            self._dirs.append(
                private.PrivateDir(root, self.replica_dir(source), key="checkpoint.local.root")
            )
            commit.remove_stale(self.replica_dir(source))

    def copies(self) -> int:
        """The snapshot-sized copies of peers' state this rank keeps in RAM at most (the
        newest of each source, and the one arriving)."""
        return 2 * len(self.sources)

    def replicate(self, step: int, path: Path, pinned: set[int]) -> None:
        """Once this rank's snapshot ``path`` of ``step`` committed: send it to the peers and
        receive theirs on the background thread, after the previous round. ``step`` is kept
        (``pinned``) until it has been sent.

        Raises:
            RecoveryError, RuntimeError: the previous round failed (a peer is gone).
        """
        if self._group is None:
            return
        self._writer.wait()
        for directory in self._dirs:
            directory.check()
        pinned.add(step)
        group = self._group.process_group

        def run() -> Path:
            try:
                send = [(path, d) for d in self.destinations]
                receive = [(s, self.replica_dir(s) / step_dir_name(step)) for s in self.sources]
                transfer.exchange(send, receive, group=group)
            finally:
                pinned.discard(step)
            for source in self.sources:  # the newest copy of each peer's is enough
                for older, p in scan(self.replica_dir(source)).committed:
                    if older != step:
                        commit.discard(p)
            return path

        self._writer.submit(run)

    def discard_newer(self, step: int) -> None:
        """A run (re)starting at ``step`` drops copies of later steps (another branch)."""
        for source in self.sources:
            for p in tiers.newer(scan(self.replica_dir(source)).committed, step):
                commit.discard(p)

    def held(self, trust: TrustStore, allow_untrusted: bool) -> dict[int, list[int]]:
        """Owner rank -> the steps of its snapshots on this node (own or copies) whose
        signed statement verifies and says this rank and this job's world size."""
        found: dict[int, set[int]] = {}
        entries = sorted(self.node_dir.iterdir()) if self.node_dir.is_dir() else []
        for entry in entries:
            named = replicas.owner_of(entry.name)
            if named is None or not entry.is_dir() or entry.is_symlink():
                continue
            owner = named[0]
            for step, path in scan(entry).committed:
                try:
                    mf = listed.read_manifest(path, trust, allow_untrusted=allow_untrusted)
                except RecoveryError as err:
                    log.warning("local tier: passing over %s: %s", path, err)
                    continue
                rec = mf.recovery
                if (rec.get("tier"), rec.get("rank"), rec.get("world_size")) == (
                    tiers.LOCAL,
                    owner,
                    self.world.size,
                ):
                    found.setdefault(owner, set()).add(step)
        return {owner: sorted(steps) for owner, steps in found.items()}

    def path_of(self, owner: int, step: int) -> Path | None:
        """Where this node holds ``owner``'s snapshot of ``step`` (its own directory first)."""
        for name in (replicas.own_name(owner), replicas.replica_name(owner)):
            candidate = self.node_dir / name / step_dir_name(step)
            if candidate.is_dir() and not candidate.is_symlink():
                return candidate
        return None

    def gather(
        self, own_dir: Path, trust: TrustStore, allow_untrusted: bool
    ) -> list[tuple[int, Path]]:
        """Collective, at a (re)start: the job's newest step every rank can restore from the
        local tier, with this rank's snapshot of it brought into ``own_dir`` from the rank
        that holds it when this node does not. Returns ``[(step, path)]``, or ``[]``.

        Raises:
            RuntimeError (torch.distributed): a peer is gone.
        """
        mine = self.held(trust, allow_untrusted)
        listings = [
            {int(k): v for k, v in json.loads(text).items()}
            for text in distributed.gather_text(json.dumps(mine))
        ]
        plan = replicas.newest_complete(listings, self.world.size)
        if plan is None:
            return []
        for owner, holder in plan.transfers():
            if self.world.rank == holder:
                source = self.path_of(owner, plan.step)
                assert source is not None  # it said it holds it
                transfer.exchange([(source, owner)], [], group=None)
            elif self.world.rank == owner:
                final = own_dir / step_dir_name(plan.step)
                transfer.exchange([], [(holder, final)], group=None)
                log.warning(
                    "local tier: this node had no snapshot of rank %d at step %d; rank %d sent "
                    "its copy (verified when read)",
                    owner,
                    plan.step,
                    holder,
                )
        here = self.path_of(self.world.rank, plan.step)
        return [(plan.step, here)] if here is not None else []

    def wait(self) -> float:
        """Wait for the round in flight; return the seconds waited.

        Raises:
            RecoveryError, RuntimeError: it failed.
        """
        return self._writer.wait()

    def raise_if_failed(self) -> None:
        """Raise a finished round's failure, once."""
        self._writer.raise_if_failed()

    def close(self, remove: bool) -> None:
        """Stop the background thread; with ``remove``, delete this rank's copies of peers'
        snapshots (the run's newest state is persistent)."""
        try:
            self._writer.close()
        finally:
            for directory in self._dirs:
                try:
                    directory.check()
                except RecoveryError as err:
                    log.warning("not removing %s: %s", directory.path, err)
                    continue
                finally:
                    directory.close()
                if remove:
                    shutil.rmtree(directory.path, ignore_errors=True)
