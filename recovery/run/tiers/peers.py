"""The local tier under ``torchrun``: each rank's snapshots copied to peers, and the restore
of a whole job's local step from what its nodes still hold (issue 30, part 4).

Under ``torchrun`` a rank's local snapshot is a continuation checkpoint of what that rank
holds (its own RNG streams, the data position, and model and optimizer keyed by parameter
name: DDP's replicated tensors or this rank's FSDP2 shards, :mod:`recovery.parallel.rankstate`),
written by
:class:`~recovery.run.tiers.snapshots.LocalTier` into ``rank<r>/`` of its node's run directory
in RAM, its statement saying ``rank`` and
``world_size``. Once it commits, a background thread sends it over a gloo group of its own
to ``checkpoint.local.replicas`` peers (:func:`recovery.parallel.replicas.offsets`: by
default the same local rank of the next node), and receives theirs into
``replica-rank<s>/``; every rank takes part in every round (the ranks snapshot the same
steps), a round waits for the previous one, and a snapshot being sent is kept until it
has been. Each node keeps the newest copy of each peer's snapshot (and the one arriving).

A rank's own older snapshot is retired only once its newest has reached the peers, so
every step a node loss could leave behind stays whole somewhere.

A restarted job (``+resume=latest``) lists what every node holds (signed manifests of
this job's world size, verified), takes the newest step whose every rank's snapshot is
held somewhere (:func:`recovery.parallel.replicas.newest_complete`), has each one held
only on another node sent to its rank (over the peers' gloo group, whatever the job's
backend), and lets that rank's resume verify it (signature, every digest) like any
snapshot; if any rank's does not verify, every rank passes that step over together. Once
the run starts, the lowest rank of each node removes the node's tier directories no rank
there uses now (an earlier layout's, or ranks that moved), so no branch the run left
comes back. The persistent tier under ``torchrun`` is promoted from the snapshots, every
rank's collectively (:mod:`recovery.run.tiers.collective`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor

from recovery.config import LocalConfig
from recovery.errors import ConfigError, RecoveryError, StorageError
from recovery.format.layout import scan, step_dir_name
from recovery.integrity.commits import commit, private
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import listed
from recovery.parallel import rankstate, replicas, transfer
from recovery.parallel import world as distributed
from recovery.parallel.collectives import Group
from recovery.parallel.world import World
from recovery.run.tiers import rules
from recovery.run.writing.background import BackgroundWriter
from recovery.state.registry import MODEL, OPTIMIZER, TrainState

log = logging.getLogger(__name__)


class Peers:
    """Keeps copies of this rank's snapshots on a peer, and the peers' copies here.

    Built on every rank at once: it agrees on the layout and creates a process group
    (collective)."""

    def __init__(self, cfg: LocalConfig, node_dir: Path, world: World) -> None:
        self.world = world
        self.node_dir = node_dir
        """The run's directory on this node (``rank<r>/`` and ``replica-rank<s>/`` in it)."""
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        first = distributed.broadcast_int(per_node)
        if not distributed.all_ok(per_node == first) and cfg.replicas and not cfg.replica_spacing:
            raise ConfigError(
                "checkpoint.local.replica_spacing=0 takes the spacing from the ranks per "
                f"node, and the nodes run different numbers (LOCAL_WORLD_SIZE {first} on rank "
                "0, another elsewhere); set checkpoint.local.replica_spacing= to one of them, "
                "or checkpoint.local.replicas=0"
            )
        space = replicas.spacing(cfg.replica_spacing, per_node)
        one_node = cfg.replica_spacing == 0 and per_node >= world.size
        if one_node and cfg.replicas:  # no other node to hold a copy: a lost node is the job
            log.info("local tier: every rank on one node: no peer replicas")
        wanted = 0 if one_node else cfg.replicas
        self.offsets = replicas.offsets(wanted, space, world.size) if wanted else []
        self.sources = replicas.sources(world.rank, world.size, self.offsets)
        self.destinations = replicas.destinations(world.rank, world.size, self.offsets)
        # gloo whatever the job's backend: snapshots are host bytes (nccl carries none)
        self._group = Group.create(distributed.timeout())
        self._writer = BackgroundWriter()
        self._lock = threading.Lock()
        """Rounds are submitted from the snapshot thread (``checkpoint.async``) and checked
        from the training thread."""
        self._dirs: list[private.PrivateDir] = []
        self._found: dict[tuple[int, int], Path] = {}
        """(owner, step) -> the verified snapshot this node holds (:meth:`held`)."""
        self.node_ranks = [world.rank]
        """The ranks whose node directory is this one (:meth:`prepare`)."""

    def replica_dir(self, source: int) -> Path:
        """Where this node keeps the copies of rank ``source``'s snapshots."""
        return self.node_dir / replicas.replica_name(source)

    def prepare(self, root: Path) -> None:
        """Collective: make or check the directories the copies arrive in (as the rank's
        own: this user's, 0700), remove what interrupted receipts left, and learn which
        ranks share this node's directory."""
        for source in self.sources:
            where = self.replica_dir(source)
            self._dirs.append(private.PrivateDir(root, where, key="checkpoint.local.root"))
            commit.remove_stale(where)
        # the ranks that see this directory: each leaves a token in it, and reads the others'
        # (not a host name or an inode: a root on a filesystem hosts share is one "node")
        nonce = distributed.broadcast_text(uuid.uuid4().hex)
        token = self.node_dir / f".member-{nonce}-{self.world.rank}"
        token.touch()
        distributed.barrier()
        seen = [m.name.rsplit("-", 1)[1] for m in self.node_dir.glob(f".member-{nonce}-*")]
        self.node_ranks = sorted(int(r) for r in seen if r.isdigit())
        distributed.barrier()
        token.unlink()

    def copies(self) -> int:
        """The snapshot-sized copies of peers' state this rank keeps in RAM at most: the
        newest of each source and the one arriving, and while a round runs the bytes it
        sends and receives."""
        return 2 * len(self.sources) + (2 if self.offsets else 0)

    def replicate(
        self, step: int, path: Path, pinned: rules.Pins, retire: Callable[[], None]
    ) -> None:
        """Once this rank's snapshot ``path`` of ``step`` committed: send it to the peers and
        receive theirs on the background thread, after the previous round; then ``retire``
        this rank's older snapshots (only then: until the peers hold ``step``, the older
        one is the newest step a lost node leaves whole). ``step`` is kept (``pinned``)
        until it has been sent. Without peers, ``retire`` runs now.

        Raises:
            RecoveryError, RuntimeError: the previous round failed (a peer is gone).
        """
        if not self.offsets:
            retire()
            return
        with self._lock:
            self._writer.wait()
            for directory in self._dirs:
                directory.check()
            pinned.add(step)
            group = self._group.process_group

            def run() -> Path:
                try:
                    send = [(path, d) for d in self.destinations]
                    into = [(s, self.replica_dir(s) / step_dir_name(step)) for s in self.sources]
                    transfer.exchange(send, into, group=group)
                finally:
                    pinned.discard(step)
                retire()
                for source in self.sources:  # the newest copy of each peer's is enough
                    for older, p in scan(self.replica_dir(source)).committed:
                        if older != step:
                            commit.discard(p)
                return path

            self._writer.submit(run)

    def adopt(self, resumed: Path | None, own_dir: Path) -> None:
        """The snapshot this rank resumed, when it is one of this node's other directories
        (a rank that moved nodes, a copy): moved into ``own_dir``, so :meth:`tidy` keeps it."""
        if resumed is None or resumed.parent == own_dir or resumed.parent.parent != self.node_dir:
            return
        with contextlib.suppress(FileNotFoundError, FileExistsError, OSError):
            os.rename(resumed, own_dir / resumed.name)

    def node_held(self) -> list[Path]:
        """Every committed snapshot in this node's run directory (own ones and copies, this
        rank's and the others'): what the RAM check counts as replaced, not added."""
        dirs = [e for e in self.node_dir.iterdir() if replicas.owner_of(e.name) is not None]
        return [p for d in dirs if d.is_dir() for _, p in scan(d).committed]

    def tidy(self, step: int) -> None:
        """At the run's first step ``step``, after every rank's resume read what it needed:
        drop copies of later steps (another branch); the node's lowest rank also removes
        the tier directories no rank of this node uses now."""
        for source in self.sources:
            for p in rules.newer(scan(self.replica_dir(source)).committed, step):
                commit.discard(p)
        if self.world.rank != min(self.node_ranks):
            return
        used = {replicas.own_name(r) for r in self.node_ranks}
        offs = self.offsets
        used |= {
            replicas.replica_name(s)
            for r in self.node_ranks
            for s in replicas.sources(r, self.world.size, offs)
        }
        for entry in sorted(self.node_dir.iterdir()):
            stale = replicas.owner_of(entry.name) is not None and entry.name not in used
            if stale and entry.is_dir() and not entry.is_symlink():
                log.info("local tier: removing %s, which no rank of this node uses", entry)
                shutil.rmtree(entry, ignore_errors=True)

    def held(self, trust: TrustStore, allow_untrusted: bool) -> dict[int, list[int]]:
        """Owner rank -> the steps of its snapshots on this node (own or copies) whose
        signed statement verifies and says this rank and this job's world size."""
        self._found = {}
        entries = sorted(self.node_dir.iterdir()) if self.node_dir.is_dir() else []
        for entry in entries:  # own directories first: "rank" sorts before "replica-rank"
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
                    rules.LOCAL,
                    owner,
                    self.world.size,
                ):
                    self._found.setdefault((owner, step), path)
        listing: dict[int, list[int]] = {}
        for owner, step in sorted(self._found):
            listing.setdefault(owner, []).append(step)
        return listing

    def gather(
        self, own_dir: Path, trust: TrustStore, allow_untrusted: bool
    ) -> list[tuple[int, Path]]:
        """Collective, at a (re)start: the job's newest step every rank can restore from the
        local tier, with this rank's snapshot of it brought into ``own_dir`` from the rank
        that holds it when this node does not. Returns ``[(step, path)]``, or ``[]``.

        Raises:
            CommitError: a copy could not be written here.
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
        group = self._group.process_group
        for owner, holder in plan.transfers():
            if self.world.rank == holder:
                transfer.exchange([(self._found[owner, plan.step], owner)], [], group=group)
            elif self.world.rank == owner:
                final = own_dir / step_dir_name(plan.step)
                transfer.exchange([], [(holder, final)], group=group)
                self._found[owner, plan.step] = final
                log.warning(
                    "local tier: this node had no snapshot of rank %d at step %d; rank %d sent "
                    "its copy (verified when read)",
                    owner,
                    plan.step,
                    holder,
                )
        return [(plan.step, self._found[self.world.rank, plan.step])]

    def agree_on_room(self, refused: StorageError | None) -> None:
        """At start, after each node's RAM check (``refused``: this rank's refusal): when
        another node's refused, refuse here too, so every rank stops at once with one line
        and none waits in a collective for a rank that is gone (collective, job's group).

        Raises:
            StorageError: another rank's local tier does not fit its node.
        """
        if distributed.all_ok(refused is None) or refused is not None:
            return
        raise StorageError(
            "checkpoint.local.root: another node's local tier does not fit in its RAM (that "
            "node's log says how much it needs); free RAM (or /dev/shm's size) there, choose "
            "another checkpoint.local.root=, or set checkpoint.local.every_steps=0",
            path=self.node_dir,
        )

    def failed(self) -> bool:
        """Whether the round submitted last has finished, and failed."""
        return self._writer.failed

    def wait(self) -> float:
        """Wait for the round in flight; return the seconds waited.

        Raises:
            RecoveryError, RuntimeError: it failed.
        """
        with self._lock:
            return self._writer.wait()

    def raise_if_failed(self) -> None:
        """Raise a finished round's failure, once (after a round being submitted is)."""
        with self._lock:
            self._writer.raise_if_failed()

    def close(self, remove: bool) -> None:
        """Stop the background thread; with ``remove``, delete this rank's copies of peers'
        snapshots (the run's newest state is persistent).

        Raises:
            RecoveryError, RuntimeError: the last round failed (the copies are kept).
        """
        try:
            with self._lock:
                self._writer.close()
        except BaseException:
            remove = False
            raise
        finally:
            for directory in self._dirs:
                try:
                    directory.check()
                    if remove:
                        shutil.rmtree(directory.path, ignore_errors=True)
                except RecoveryError as err:
                    log.warning("not removing %s: %s", directory.path, err)
                finally:
                    directory.close()


def single(
    held: list[tuple[int, Path]], trust: TrustStore, allow_untrusted: bool
) -> list[tuple[int, Path]]:
    """The snapshots of ``held`` a process outside torchrun may resume: not those one rank
    of a torchrun job took (``rank0/`` of a run directory a job used before), which hold
    that rank's state alone. One whose signature does not verify stays, for the resume to
    say why it passes it over."""
    kept = []
    for step, path in held:
        with contextlib.suppress(RecoveryError):
            rec = listed.read_manifest(path, trust, allow_untrusted=allow_untrusted).recovery
            if "rank" in rec:
                log.warning(
                    "local tier: passing over %s: rank %s's snapshot of a %s-rank torchrun "
                    "job, not a whole state for one process",
                    path,
                    rec.get("rank"),
                    rec.get("world_size"),
                )
                continue
        kept.append((step, path))
    return kept


def tree(state: TrainState, view: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a rank's snapshot holds of ``state``: every component's state and the RNG
    streams, model and optimizer keyed by parameter name, with FSDP2 this rank's own shards
    (:func:`recovery.parallel.rankstate.view`, or ``view`` when taken already, then
    ``local``), as the persistent tier writes them."""
    taken = state.state_dict()
    if view is None:
        view = rankstate.view(state.components[MODEL], state.components[OPTIMIZER])
    taken.update(rankstate.local(view))
    return taken


def owner(world: World) -> dict[str, Any]:
    """The ``state.json`` record of whose snapshot it is (:data:`~recovery.format.layout.
    RANK_SNAPSHOT`): the rank and the world size; ``by_name``: model and optimizer are keyed
    by parameter name (:func:`tree`)."""
    return {"rank": world.rank, "world_size": world.size, "by_name": True}


def nbytes(state: TrainState) -> int:
    """The tensor bytes a snapshot of ``state`` holds now (with FSDP2 this rank's shards),
    read without touching an optimizer that has not stepped yet."""
    from torch.utils._pytree import tree_leaves

    tree = rankstate.local(state.state_dict())
    return sum(t.numel() * t.element_size() for t in tree_leaves(tree) if isinstance(t, Tensor))
