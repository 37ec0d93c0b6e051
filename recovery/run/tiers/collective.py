"""Promotion under ``torchrun``: the ranks' local snapshots of a step become one persistent
checkpoint, written collectively in the background (issue 30, part 2).

In one process a promotion copies the snapshot's files (:mod:`recovery.integrity.commits.promote`):
the persistent checkpoint is the same files. Under ``torchrun`` the persistent tier has
another layout than a rank's snapshot (DCP's shards of every rank, each rank's RNG streams
in ``ranks/``, rank 0's replicated components: :mod:`recovery.parallel.multirank`, so that
it reshards onto any world size), so each rank's promotion thread instead

1. reads its own snapshot of the step back from RAM and verifies it (signature, every
   digest, the root digest it committed) before decoding a byte of it;
2. rebuilds what the collective save writes (:func:`parts_of`): model and optimizer as
   DCP's state-dict API gives them (the snapshot keeps them keyed by parameter name, FSDP2's
   as this rank's shards, wrapped again as DTensors with the live ones' mesh and
   placements, recorded at the snapshot), its RNG streams, and on rank 0 the other
   components;
3. agrees with the other ranks that every one of them could (if any could not, all
   raise, and nothing is written);
4. runs the collective protocol over a gloo group of its own
   (:meth:`~recovery.run.writing.strategies.Ranks.commit_parts`): rank 0 signs and commits a
   statement saying ``promoted: true``; the journal's record says ``mode: promoted``.

The training thread paused once, for the snapshot. Every rank snapshots and promotes the
same steps in the same order (the save decision is collective), one promotion at a time.
A job that resumed from its ranks' snapshots promotes that step at once
(:meth:`RankPromotion.start`), keeping the snapshot's statement, run metadata and config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery.errors import CommitError, FormatError, RecoveryError, SignatureError
from recovery.format.layout import CONFIG_FILE, RANK_SNAPSHOT
from recovery.format.manifest import Manifest
from recovery.integrity.keys.signing import Signer, TrustStore
from recovery.integrity.reads import listed, reader
from recovery.parallel import rankstate
from recovery.parallel import world as distributed
from recovery.parallel.collectives import Group
from recovery.parallel.multirank import Parts
from recovery.provenance import lineage
from recovery.run.tiers import rules
from recovery.run.tiers.copying import Then
from recovery.run.tiers.rules import Pins
from recovery.run.writing import job as job_mod
from recovery.run.writing.background import BackgroundWriter
from recovery.run.writing.job import SaveJob, Tensors, split
from recovery.run.writing.staging import host_dtensor
from recovery.run.writing.strategies import Ranks
from recovery.state import snapshot
from recovery.state.registry import MODEL, OPTIMIZER, RNG, TrainState

log = logging.getLogger(__name__)


def specs(view: dict[str, Any]) -> dict[str, Any]:
    """What a promotion needs of the live ``view`` (:func:`recovery.parallel.rankstate.view`):
    its tree, every DTensor kept (for its mesh, placements, shape and stride, not its data)
    and every other leaf ``None``. Taken on the training thread, at the snapshot."""
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map

    return dict(tree_map(lambda t: t if isinstance(t, DTensor) else None, view))


def rewrap(saved: Any, like: Any, where: str) -> Any:
    """``saved`` (a snapshot's tree, plain tensors) with every leaf whose counterpart in
    ``like`` (:func:`specs`) is a DTensor wrapped again as one, over the saved tensor.

    Raises:
        FormatError: the trees differ (naming the first key that does).
    """
    if isinstance(like, dict):
        if not isinstance(saved, dict) or saved.keys() != like.keys():
            raise FormatError(f"{where}: the snapshot's keys differ from this rank's state")
        return {k: rewrap(saved[k], like[k], f"{where}/{k}") for k in like}
    if isinstance(like, list | tuple):
        if not isinstance(saved, list | tuple) or len(saved) != len(like):
            raise FormatError(f"{where}: the snapshot's entries differ from this rank's state")
        pairs = enumerate(zip(saved, like, strict=True))
        return type(like)(rewrap(s, ll, f"{where}/{i}") for i, (s, ll) in pairs)
    return saved if like is None else host_dtensor(saved, like)


def parts_of(
    tree: dict[str, Any], like: dict[str, Any], *, leader: bool
) -> tuple[Parts, tuple[dict[str, Any], Tensors]]:
    """What the collective save writes of a decoded snapshot ``tree``
    (:func:`recovery.run.tiers.peers.tree`): this rank's :class:`Parts` and, on rank 0
    (``leader``), the replicated components split into skeletons and tensors.

    Raises:
        FormatError: the snapshot lacks model, optimizer or RNG streams, or its model and
            optimizer do not have ``like``'s keys.
    """
    missing = [n for n in (MODEL, OPTIMIZER, RNG) if n not in tree]
    optimizer = tree.get(OPTIMIZER)
    if missing or not isinstance(optimizer, dict) or "state" not in optimizer:
        raise FormatError(f"the snapshot lacks {', '.join(missing) or 'the optimizer state'}")
    tensors = {
        MODEL: rewrap(tree[MODEL], like[MODEL], MODEL),
        OPTIMIZER: rewrap(optimizer["state"], like[OPTIMIZER]["state"], f"{OPTIMIZER}/state"),
    }
    groups = {"param_groups": optimizer.get("param_groups", [])}
    replicated = {n: v for n, v in tree.items() if n not in (MODEL, OPTIMIZER, RNG)}
    return Parts({RNG: tree[RNG]}, tensors, groups), split(replicated if leader else {})


@dataclass(frozen=True)
class Source:
    """The keys a snapshot taken by an earlier process is verified against.

    They are the resume's trust store and ``checkpoint.allow_untrusted``."""

    trust: TrustStore
    untrusted: bool = False


class RankPromotion:
    """Promotes this rank's local snapshots to the run directory under ``torchrun``, through
    the job's collective save, one at a time on ``writer``.

    A snapshot being read is ``pinned`` (never retired) until its promotion is done. Every
    rank of the job makes one at the same point (creating its gloo group is collective)."""

    def __init__(
        self, saver: Ranks, signer: Signer, writer: BackgroundWriter, pinned: Pins
    ) -> None:
        self.saver = saver
        self.trust = TrustStore().with_signer(signer)
        """A snapshot is this run's own: signed by its signer."""
        self.writer = writer
        self.pinned = pinned
        self.group = Group.create(distributed.timeout())

    def then(
        self, job: SaveJob, view: dict[str, Any], *, waited: float, resumed: Source | None = None
    ) -> Then:
        """What follows ``job``'s step's snapshot: its promotion (:meth:`promote`) on the
        promotion thread. ``view``: the live state's (:func:`recovery.parallel.rankstate.view`,
        taken on the training thread), whose DTensors' specs the promotion keeps."""
        like = specs(view)

        def then(path: Path, mf: Manifest, pause: float) -> None:
            self.pinned.add(job.step)

            def run() -> Path:
                try:
                    return self.promote(
                        job, path, mf, like, pause=pause, waited=waited, resumed=resumed
                    )
                finally:
                    self.pinned.discard(job.step)

            self.writer.submit(run)

        return then

    def taking(
        self, job: SaveJob, state: TrainState, *, waited: float
    ) -> tuple[dict[str, Any], Then]:
        """At ``job``'s step, on the training thread: DCP's view of the live model and
        optimizer, taken once for the snapshot's tree and for the specs its promotion wraps
        the shards with, and what follows the snapshot (:meth:`then`)."""
        view = rankstate.view(state.components[MODEL], state.components[OPTIMIZER])
        return view, self.then(job, view, waited=waited)

    def start(
        self, state: TrainState, path: Path | None, final: Path, *, root: str | None, source: Source
    ) -> bool:
        """At the run's first step, when every rank resumed from its local snapshot (``path``:
        this rank's, ``None`` if it did not), promote that step in the background unless the
        run directory holds it (``final``) already: the recovered state becomes durable.
        Collective on the job's group (every rank calls it, on the training thread).
        ``root``: the digest the resume verified, which the snapshot must still have.

        Returns:
            Whether ``final`` is a persistent checkpoint already (its promotion committed
            before the job died).

        Raises:
            SignatureError: a rank's snapshot changed since its resume verified it (on every
                rank).
        """
        held = path is not None and path.is_dir()
        if not distributed.all_ok(held):
            if held:  # every rank resumed from the persistent tier, or this one alone holds it
                log.warning(
                    "local tier: not promoting %s: not every rank holds its snapshot of that "
                    "step now; the next persistent step makes the run durable",
                    path,
                )
            return False
        there = 0  # rank 0 says: 0 nothing at final, 1 a persistent checkpoint, 2 something else
        if self.saver.world.leader and final.exists():
            there = 2
            with contextlib.suppress(RecoveryError):
                mf = listed.read_manifest(final, source.trust, allow_untrusted=source.untrusted)
                there = 1 if mf.recovery.get("tier") != rules.LOCAL else 2
        there = distributed.broadcast_int(there)
        if there == 2:  # never written over: what the resume passed over stays for a person
            log.warning(
                "local tier: not promoting the step resumed from: %s holds something that is "
                "not a persistent checkpoint of this run; the next persistent step makes the "
                "run durable",
                final,
            )
        if there:
            return there == 1
        assert path is not None
        why = ""
        try:
            mf = listed.read_manifest(path, source.trust, allow_untrusted=source.untrusted)
            if mf.root != root:
                why = f"its root is {mf.root}, the resume verified {root}"
        except RecoveryError as err:  # every rank hears of it: none waits in a collective
            why = str(err)
        if not distributed.all_ok(not why):
            raise SignatureError(
                f"{path}: a rank's snapshot changed since the resume verified it ("
                f"{why or 'on another rank: its log says how'}); not promoting it. Requeue "
                "the job.",
                path=path,
            )
        dropped = ("tier", "rank", "components")
        job = dataclasses.replace(
            job_mod.resumed(final, mf),
            statement={k: v for k, v in mf.recovery.items() if k not in dropped},
            absent=dict(state.absent),
        )
        view = rankstate.view(state.components[MODEL], state.components[OPTIMIZER])
        self.then(job, view, waited=0.0, resumed=source)(path, mf, 0.0)
        return False

    def promote(
        self,
        job: SaveJob,
        path: Path,
        mf: Manifest,
        like: dict[str, Any],
        *,
        pause: float,
        waited: float,
        resumed: Source | None = None,
    ) -> Path:
        """Promote the snapshot ``path`` (committed as ``mf``) to ``job.final``; every rank
        calls it for the same step, on its promotion thread. ``resumed``: a snapshot an
        earlier process took (verified with the resume's trust), whose run metadata and
        config the promoted checkpoint keeps.

        Raises:
            CommitError: this or another rank could not read its snapshot back, or the
                collective save failed; nothing was committed.
        """
        begun = time.perf_counter()
        failure: Exception | None = None
        try:
            parts, replicated, kept = self._read(path, mf, like, resumed)
        except Exception as err:  # whatever it is, the other ranks must hear of it, not hang
            failure = err
        if not self.group.all_ok(failure is None):
            why = (
                f"could not read {path} back ({failure})"
                if failure
                else ("another rank could not read its snapshot back (its log says why)")
            )
            if resumed is not None:  # the state is back already: no reason to stop the job
                log.warning(
                    "local tier: step %d resumed from is not promoted: %s; the next "
                    "persistent step makes the run durable",
                    job.step,
                    why,
                )
                return job.final
            raise CommitError(
                f"step {job.step}: not promoted: {why}; nothing was committed and earlier "
                "checkpoints are intact.",
                path=job.final,
            ) from failure
        if resumed is not None:
            meta, config_yaml = kept
            job = dataclasses.replace(job, meta=meta, config_yaml=config_yaml)
        # rank 0's snapshot: a link recorded while the run resumed from it resolves here
        source = {"sha256": mf.root, "step": mf.step}
        statement = {**job.statement, "promoted": True, lineage.PROMOTED_FROM: source}
        promoted = dataclasses.replace(job, statement=statement)
        self.saver.commit_parts(
            promoted, parts, replicated, begun, waited, mode="promoted", pause=pause,
            comm=self.group,
        )  # fmt: skip
        return job.final

    def _read(
        self, path: Path, mf: Manifest, like: dict[str, Any], resumed: Source | None
    ) -> tuple[Parts, tuple[dict[str, Any], Tensors], tuple[dict[str, Any], str]]:
        """The parts of the verified snapshot ``path``, and its run metadata and config."""
        trust, untrusted = (resumed.trust, resumed.untrusted) if resumed else (self.trust, False)
        verified = reader.read_verified(path, trust, allow_untrusted=untrusted)
        if verified.manifest.root != mf.root:  # not the snapshot this rank committed
            raise SignatureError(
                f"{path}: its root digest is {verified.manifest.root}, the snapshot committed "
                f"{mf.root}",
                path=path,
            )
        decoded = snapshot.decode(verified)
        try:
            parts = parts_of(decoded.tree, like, leader=self.saver.world.leader)
        except FormatError as err:
            raise FormatError(f"{path}: {err}", path=path) from err
        meta = {k: v for k, v in decoded.meta.items() if k != RANK_SNAPSHOT}
        raw = verified.files.get(CONFIG_FILE)
        config_yaml = raw.decode() if isinstance(raw, bytes) else ""
        return *parts, (meta, config_yaml)
