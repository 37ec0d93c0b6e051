"""Begins a run: fresh, resumed, warm-started, or a branch from an older step.

The steps are modules of their own: :mod:`~recovery.run.restoring.rundir` (create,
lock, tidy the run directory), :mod:`~recovery.run.restoring.begin` (choose the
checkpoint, verify and load it; or a new run), :mod:`~recovery.run.restoring.branches`
(a resume from an older step moves the newer ones aside) and
:mod:`~recovery.run.restoring.selfcheck` (the steps a resume redoes compared with the
journal). :class:`Restorer` sequences them for one run and holds what a begun run
keeps until it ends: the writer's lock, the watch (:mod:`recovery.run.monitoring.watch`) and the
self-check.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recovery.config import CheckpointConfig, HealthConfig
from recovery.errors import VerificationError
from recovery.format.layout import METRICS_FILE, is_dcp_shard
from recovery.integrity.commits.lock import RunLock
from recovery.parallel import sharded
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.provenance import purpose
from recovery.provenance.purpose import PurposeSpec
from recovery.run import journal as journal_mod
from recovery.run.journal import Journal
from recovery.run.monitoring import fingerprint
from recovery.run.monitoring.watch import Watch
from recovery.run.restoring import begin, branches, choose, rundir, selfcheck
from recovery.run.restoring.history import History
from recovery.run.scheduling.preemption import PreemptionGuard
from recovery.run.status import RunStatus, Trust
from recovery.run.tiers import rules
from recovery.run.tiers.snapshots import LocalTier
from recovery.run.writing.differential import Differential
from recovery.state.health import UPDATE
from recovery.state.registry import MODEL, TrainState

log = logging.getLogger(__name__)


class Restorer:
    """Restores a run's :class:`~recovery.state.registry.TrainState` at its start and holds
    the run directory's lock, the watch and the self-check until the run ends.

    Args:
        cfg: the checkpoint settings (``strict_resume``, ``resume_check``).
        run_dir: the run directory.
        status: the run's shared status: a restore sets its identity and steps.
        journal: the run's journal; ``journal_path`` is where it lies on every rank.
        trust: whose artifacts load, whose journal seals count.
        world, seed: the rank and job size; the seed a resharding resume reseeds from.
        provenance, config: this process's, compared with the checkpoint's (drift).
        purposes: the contracts by purpose name (the continuation's is checked first).
        local: the local tier, whose snapshots ``latest`` also considers.
        differential: forgets or adopts the base of the next delta save.
        final_step: the run's last step (a rerun of a finished run says so).
        health: the resume health monitor's settings (``None``: none of its own).
        guard: the preemption guard to install once the run has begun (``None``: none
            to install: the caller owns it, or there is none).
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        run_dir: Path,
        *,
        status: RunStatus,
        journal: Journal,
        trust: Trust,
        world: World,
        seed: int,
        provenance: dict[str, Any],
        config: dict[str, Any],
        purposes: Mapping[str, PurposeSpec],
        local: LocalTier | None,
        differential: Differential,
        final_step: int,
        health: HealthConfig | None,
        guard: PreemptionGuard | None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.root = run_dir.parent
        self.status = status
        self.journal = journal
        self.trust = trust
        self.world = world
        self.seed = seed
        self.provenance = provenance
        self.config = config
        self.purposes = purposes
        self.local = local
        self.differential = differential
        self.final_step = final_step
        self.health = health
        self.guard = guard
        self.watch: Watch | None = None
        """The run's watch (resume health, state changed after a save), once it began."""
        self._lock: RunLock | None = None
        self._past: History | None = None
        """The journal's history as the start read it (rank 0), for the resume to reuse."""
        self._check: selfcheck.ResumeCheck | None = None
        """The self-check of this process's resume, while it compares."""

    @property
    def journal_path(self) -> Path:
        """Where the run's journal lies: ranks > 0 write none but read the same file, so
        every rank takes one decision."""
        return self.journal.path or self.run_dir / METRICS_FILE

    @property
    def locked(self) -> bool:
        """Whether this process holds the run directory's writer lock."""
        return self._lock is not None

    def restore(
        self, state: TrainState, resume_spec: object | None, init_from: object | None
    ) -> int:
        """Restore ``state`` as asked; return the step to start from (see
        :meth:`Checkpointer.restore <recovery.run.checkpointer.Checkpointer.restore>`).

        Before anything is touched the state must meet the continuation contract
        (declared absences accepted); after, the registration cautions are journaled,
        the run is watched and the guard (if any) catches preemption signals. A refused
        start leaves nothing behind: the lock released, the local tier's promotion
        finished.
        """
        spec = self.purposes[purpose.CONTINUATION]
        purpose.check_state(spec.name, spec.requires, state.names, state.absent)
        state.review()  # objects wired since the state was built (a scheduler made later)
        self._lock, self._past = rundir.prepare(
            self.run_dir, self.world, self.journal_path, self.trust.events
        )
        if self._past is not None and self.journal.path is not None:
            self.journal.chain_from(self._past.tip)  # read once: no second pass to find it
        try:
            if self.watch is None:  # registers the health monitor before anything loads
                self.watch = Watch(
                    state,
                    self.journal,
                    health=self.health,
                    fingerprint=self.cfg.resume_check.fingerprint,
                )
            if self.local is not None:
                self.local.prepare()
            step = self._begin(state, resume_spec, init_from)
            if self.local is not None:  # the RAM it needs fits, or one line before step 1
                persistent = self.local.start(
                    state,
                    step,
                    resumed=self.status.identity.resumed_from,
                    root=(self.status.identity.previous or {}).get("sha256"),
                    trust=self.trust.artifacts,
                    allow_untrusted=self.trust.allow_untrusted,
                )
                if persistent:  # its promotion had committed before the process died
                    self.status.persisted = step
            self.watch.started(step)
        except BaseException:
            if self.local is not None:  # its promotion finished before the lock goes
                self.local.abandon()
            self.release(tidy=True)  # refused: nothing left behind that this start made
            raise
        for caution in state.cautions:
            self.journal.write(caution.record())
        if self.guard is not None:
            if threading.current_thread() is threading.main_thread():
                self.guard.install()
            else:
                log.info("not on the main thread: preemption signals are not caught")
        return step

    def _begin(self, state: TrainState, resume_spec: object, init_from: object) -> int:
        if resume_spec is not None:
            step = self._resume_if_any(state, resume_spec)
            if step is not None:
                return step
        else:
            rundir.refuse_reuse(self.run_dir)
            if self.local is not None:
                self.local.refuse_reuse()
        self.differential.forget()  # a candidate that was adopted, then not resumed
        # one id for the job: every rank's local snapshots carry it (rank 0's, as its commits)
        run_id = self.status.identity.run_id
        if self.world.distributed:
            run_id = distributed.broadcast_text(run_id)
        self.status.identity, event = begin.new_run(
            state,
            init_from,
            run_id,
            self.trust.artifacts,
            self.trust.allow_untrusted,
            root=self.root,
        )
        self.journal.write({**event, **({"absent": state.absent} if state.absent else {})})
        return 0

    def _resume_if_any(self, state: TrainState, resume_spec: object) -> int | None:
        """Resume from the checkpoint ``resume_spec`` names; ``None``: ``latest`` found none."""
        latest = choose.parse_spec(resume_spec) == choose.LATEST
        # under torchrun each rank verifies only the DCP shards it reads, as DCP reads
        # them; a damaged one fails the load on every rank (DCP gathers the failures)
        defer = is_dcp_shard if self.world.distributed else None
        damaged: dict[Path, str] = {}
        local = None  # the local tier's candidates (under torchrun: collective)
        if self.local is not None and latest:
            local = self.local.candidates(self.trust.artifacts, self.trust.allow_untrusted)
        while True:
            loaded, replaced, _ = begin.pick(
                self.run_dir,
                resume_spec,
                self.trust.artifacts,
                allow_untrusted=self.trust.allow_untrusted,
                journal=self.journal_path,
                events_trust=self.trust.events,
                strict=self.cfg.strict_resume,
                defer=defer,
                exclude=damaged,
                local=local,
                past=self._past,
            )
            if loaded is None:
                return None
            try:
                step = self._resume(state, loaded, replaced)
            except VerificationError as err:
                if not latest:
                    raise
                # nothing was applied: the shards are read into copies first
                log.warning("RESUME FALLBACK: skipping %s, read by DCP: %s", loaded.path, err)
                damaged[loaded.path] = str(err)
                continue
            if not latest and self.world.leader:
                branches.abandon(self.run_dir, step, self.journal.write)  # a branch from here
            distributed.barrier()
            return step

    def _resume(
        self,
        state: TrainState,
        loaded: choose.Loaded,
        replaced: str | None,
    ) -> int:
        # first: what it reads can still refuse (a base's file that does not decode), and
        # nothing may fail once the state is loaded
        self.differential.adopt(self.run_dir, loaded.verified, loaded.links, loaded.decoded)
        ident = begin.resume_from(
            state,
            loaded,
            run_id=self.status.identity.run_id,
            provenance=self.provenance,
            config=self.config,
            strict=self.cfg.strict_resume,
            root=self.root,
            world=self.world,
            seed=self.seed,
        )
        self.status.identity = ident
        self.status.last_saved = ident.step
        if loaded.manifest.recovery.get("tier") != rules.LOCAL:
            self.status.persisted = ident.step  # a local snapshot is once its promotion commits
        self.journal.write(begin.resume_event(loaded, ident, self.world.size, replaced=replaced))
        self._start_check(state, ident.step, replaced, drift=ident.drift)
        if ident.step >= self.final_step and self.world.leader:
            log.info("%s", begin.finished(ident.step, self.final_step))
        return ident.step

    def _start_check(
        self,
        state: TrainState,
        step: int,
        replaced: str | None,
        *,
        drift: list[str],
    ) -> None:
        """Compare the steps this resume redoes with the journal's, when that means anything;
        either way its verdict goes into the run's lineage (every later checkpoint signs it)."""
        check = self.cfg.resume_check
        if not check.enabled:
            self._not_compared(step, selfcheck.TURNED_OFF)
            return
        if self.status.identity.resharded:  # another world size reseeds: not the same run
            self._not_compared(step, selfcheck.RESHARDED)
            return
        if replaced is not None:  # another run's checkpoint: this journal's steps are not its
            self._not_compared(step, selfcheck.REPLACED)
            return
        if self.world.rank and sharded.is_sharded(state.components.get(MODEL)):
            # the journal's update sizes and fingerprints are rank 0's shard's: another
            # rank's differ
            check = dataclasses.replace(check, ignore=[*check.ignore, UPDATE, *fingerprint.FIELDS])
        # what the run did after the checkpoint: only the journal's segments that hold it
        journaled = self.journal_path.is_file()
        recorded = journal_mod.steps_after(self.journal_path, step) if journaled else {}
        self._check = selfcheck.ResumeCheck(
            recorded,
            resumed_at=step,
            cfg=check,
            journal=self.journal,
            rank=self.world.rank,
            done=self._sign_check,
            drift=drift,
        )
        if self._check.done:  # the dead process journaled no step after the checkpoint
            self._check = None
            self._not_compared(step, selfcheck.nothing_redone(step, self.final_step))
            return
        self.journal.watch(self._check)
        if self.watch is not None:  # the redone steps the dead process fingerprinted, again
            marked = (s for s, r in recorded.items() if s > step and fingerprint.PARAMETERS in r)
            self.watch.fingerprints.also(marked)

    def _not_compared(self, step: int, reason: str) -> None:
        """Journal and sign a resume that is not compared, and why."""
        record = selfcheck.skipped(step, reason)
        self.journal.write(record)
        self._sign_check(record)

    def _sign_check(self, summary: dict[str, Any]) -> None:
        # a new segment dict: a save job in flight keeps the list it copied, untouched
        lineage = self.status.identity.lineage
        lineage[-1] = {**lineage[-1], "check": selfcheck.signed(summary)}

    def release(self, *, tidy: bool = False) -> None:
        """End what a begun run holds: a self-check not finished says how far it got, the
        watch stops, the guard is uninstalled and the lock dropped (``tidy``: a refused
        start, see :meth:`~recovery.integrity.commits.lock.RunLock.release`)."""
        if self._check is not None:
            self._check.finish()
            self._check = None
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        if self.guard is not None:
            self.guard.uninstall()
        if self._lock is not None:
            self._lock.release(tidy=tidy)
            self._lock = None
