"""The restoring half of :class:`~recovery.run.checkpointer.Checkpointer`.

How a run begins (fresh, resumed, warm-started, or a branch from an older
step) and the run's identity, journal and lock that the saving half shares.
The steps themselves are :mod:`recovery.run.rundir`, :mod:`recovery.run.restore`
(``begin``) and :mod:`recovery.run.branches`; this class only sequences them
for one run. Before anything is touched, the state must be able to meet the
continuation contract (each required piece registered or declared absent,
:func:`recovery.provenance.purpose.check_state`); once the run has begun, the
registration guards' cautions are journaled (``{"event": "warning", ...}``),
the run is watched (:mod:`recovery.run.watch`: resume health, state changed
after a save) and the default preemption guard is installed.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recovery.config import CheckpointConfig, HealthConfig
from recovery.errors import VerificationError
from recovery.format.layout import METRICS_FILE, is_dcp_shard
from recovery.integrity.lock import RunLock
from recovery.integrity.signing import TrustStore
from recovery.parallel import sharded
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.provenance import purpose
from recovery.provenance.purpose import PurposeSpec
from recovery.run import branches, resume, rundir, selfcheck, tiers
from recovery.run import restore as begin
from recovery.run.cadence import Cadence
from recovery.run.differential import Differential
from recovery.run.journal import Journal
from recovery.run.preemption import PreemptionGuard
from recovery.run.watch import Watch
from recovery.state.health import UPDATE
from recovery.state.registry import MODEL, TrainState

if TYPE_CHECKING:
    from recovery.run.localtier import LocalTier

log = logging.getLogger(__name__)


class Restoring:
    """Restores a run's :class:`TrainState` and keeps who the run is (mixed into the
    checkpointer, which sets these attributes)."""

    cfg: CheckpointConfig
    run_dir: Path
    root: Path
    trust: TrustStore
    events_trust: TrustStore
    allow_untrusted: bool
    world: World
    seed: int
    provenance: dict[str, Any]
    config: dict[str, Any]
    journal: Journal
    purposes: dict[str, PurposeSpec]
    identity: begin.Identity
    local: LocalTier | None
    """The local tier (:mod:`recovery.run.tiers`): ``latest`` looks there too."""
    last_saved: int | None
    persisted: int | None
    preemption: PreemptionGuard | None
    _lock: RunLock | None
    _owned: tuple[bool, bool]
    """Whether the checkpointer made its journal and its preemption guard (it closes them)."""
    _health: HealthConfig | None
    _watch: Watch | None
    _check: selfcheck.ResumeCheck | None = None
    """The self-check of this process's resume (:mod:`recovery.run.selfcheck`), if it resumed."""
    differential: Differential
    cadence: Cadence

    def restore(
        self,
        state: TrainState,
        resume_spec: object | None = None,
        *,
        init_from: object | None = None,
    ) -> int:
        """Restore ``state`` as asked; return the step to start from.

        - ``resume_spec`` (``+resume=``): continue this run from that checkpoint.
          With ``latest`` and nothing to resume, fall through to ``init_from`` or
          a fresh start, so a requeued command line works at every stage.
        - ``init_from`` (``+init_from=``): a new run whose model weights come from
          a continuation or warm-start artifact; optimizer, schedule, sampler and
          step start fresh.
        - neither: a fresh run; the run directory must not hold checkpoints.

        Before anything is touched the state must meet the continuation contract
        (declared absences accepted); after, the registration cautions are journaled,
        the run is watched and (by default) preemption signals are caught.

        Raises:
            PurposeError: ``state`` neither registers nor declares absent a piece the
                continuation contract requires (ConfigError: a declaration is refused).
            RunDirLockedError: another process is writing the run directory.
            RunDirInUseError: a fresh or warm-started run into a directory holding checkpoints.
            CheckpointNotFoundError, VerificationError, FormatError: a named artifact
                is absent, damaged or untrusted.
            ForeignCheckpointError: ``latest`` found only another run's checkpoints.
            PurposeError: the artifact cannot serve the use.
            DriftError: ``checkpoint.strict_resume`` and something changed (RollbackError:
                the newest checkpoint the run committed is gone).
            IncompatibleStateError: it does not fit ``state``; nothing was changed.
        """
        spec = self.purposes[purpose.CONTINUATION]
        purpose.check_state(spec.name, spec.requires, state.names, state.absent)
        state.review()  # objects wired since the state was built (a scheduler made later)
        self._lock = rundir.prepare(
            self.run_dir, self.world, self._journal_path(), self.events_trust
        )
        try:
            if self._watch is None:  # registers the health monitor before anything loads
                self._watch = Watch(state, self.journal, health=self._health)
            if self.local is not None:
                self.local.prepare()
            step = self._restore(state, resume_spec, init_from)
            if self.local is not None:  # the RAM it needs fits, or one line before step 1
                persistent = self.local.start(
                    state,
                    step,
                    resumed=self.resumed_from,
                    root=(self.identity.previous or {}).get("sha256"),
                    trust=self.trust,
                    allow_untrusted=self.allow_untrusted,
                )
                if persistent:  # its promotion had committed before the process died
                    self.persisted = step
            self._watch.started(step)
        except BaseException:
            if self.local is not None:  # its promotion finished before the lock goes
                self.local.abandon()
            self._release(tidy=True)  # refused: nothing left behind that this start made
            raise
        for caution in state.cautions:
            self._event(caution.record())
        if self._owned[1] and self.preemption is not None:
            if threading.current_thread() is threading.main_thread():
                self.preemption.install()
            else:
                log.info("not on the main thread: preemption signals are not caught")
        return step

    def record(self, step: int, **fields: Any) -> None:
        """Write the per-step record of optimizer step ``step`` to the run's journal.

        ``fields``: ``loss=`` (what the resume health monitor judges), ``epoch=``,
        ``batch=``, ...; ``lr`` (the rate the step used) and ``update`` (the health
        probe's update size) are added when the checkpointer measured them.
        """
        self.journal.step(step, **fields)

    def _restore(self, state: TrainState, resume_spec: object, init_from: object) -> int:
        if resume_spec is not None:
            latest = resume.parse_spec(resume_spec) == resume.LATEST
            # under torchrun each rank verifies only the DCP shards it reads, as DCP reads
            # them; a damaged one fails the load on every rank (DCP gathers the failures)
            defer = is_dcp_shard if self.world.distributed else None
            damaged: dict[Path, str] = {}
            local = None  # the local tier's candidates (under torchrun: collective)
            if self.local is not None and latest:
                local = self.local.candidates(self.trust, self.allow_untrusted)
            while True:
                loaded, replaced, past = begin.choose(
                    self.run_dir,
                    resume_spec,
                    self.trust,
                    allow_untrusted=self.allow_untrusted,
                    journal=self._journal_path(),
                    events_trust=self.events_trust,
                    strict=self.cfg.strict_resume,
                    defer=defer,
                    exclude=damaged,
                    local=local,
                )
                if loaded is None:
                    break
                try:
                    step = self._resume(state, loaded, replaced, past.steps)
                except VerificationError as err:
                    if not latest:
                        raise
                    # nothing was applied: the shards are read into copies first
                    log.warning("RESUME FALLBACK: skipping %s, read by DCP: %s", loaded.path, err)
                    damaged[loaded.path] = str(err)
                    continue
                if not latest and self.world.leader:
                    branches.abandon(self.run_dir, step, self._event)  # a branch from here
                distributed.barrier()
                return step
        else:
            rundir.refuse_reuse(self.run_dir)
            if self.local is not None:
                self.local.refuse_reuse()
        self.differential.forget()  # a candidate that was adopted, then not resumed
        # one id for the job: every rank's local snapshots carry it (rank 0's, as its commits)
        run_id = distributed.broadcast_text(self.run_id) if self.world.distributed else self.run_id
        self.identity, event = begin.new_run(
            state, init_from, run_id, self.trust, self.allow_untrusted, root=self.root
        )
        self._event({**event, **({"absent": state.absent} if state.absent else {})})
        return 0

    def _resume(
        self,
        state: TrainState,
        loaded: resume.Loaded,
        replaced: str | None,
        recorded: dict[int, dict[str, Any]],
    ) -> int:
        # first: what it reads can still refuse (a base's file that does not decode), and
        # nothing may fail once the state is loaded
        self.differential.adopt(self.run_dir, loaded.verified, loaded.base, loaded.decoded)
        ident = begin.resume_from(
            state,
            loaded,
            run_id=self.run_id,
            provenance=self.provenance,
            config=self.config,
            strict=self.cfg.strict_resume,
            root=self.root,
            world=self.world,
            seed=self.seed,
        )
        self.identity = ident
        self.last_saved = ident.step
        if loaded.manifest.recovery.get("tier") != tiers.LOCAL:
            self.persisted = ident.step  # a local snapshot is once its promotion commits
        self._event(begin.resume_event(loaded, ident, self.world.size, replaced=replaced))
        check = self.cfg.resume_check
        if check.enabled and ident.resharded:  # another world size reseeds: not the same run
            self._event(selfcheck.skipped(ident.step, "resharded onto another world size"))
        # another run's checkpoint continued knowingly: this journal's steps are not its own
        elif check.enabled and replaced is None:
            if self.world.rank and sharded.is_sharded(state.components.get(MODEL)):
                # the journal's update sizes are rank 0's shard's: another rank's differ
                check = dataclasses.replace(check, ignore=[*check.ignore, UPDATE])
            self._check = selfcheck.ResumeCheck(
                recorded,
                resumed_at=ident.step,
                cfg=check,
                journal=self.journal,
                rank=self.world.rank,
                done=self._sign_check,
                drift=ident.drift,
            )
            if self._check.done:  # the dead process journaled no step after the checkpoint
                why = selfcheck.nothing_redone(ident.step, self.cadence.final_step)
                self._event(selfcheck.skipped(ident.step, why))
                self._check = None
            else:
                self.journal.watch(self._check)
        if ident.step >= self.cadence.final_step and self.world.leader:
            log.info("%s", begin.finished(ident.step, self.cadence.final_step))
        return ident.step

    def _sign_check(self, summary: dict[str, Any]) -> None:
        # a new segment dict: a save job in flight keeps the list it copied, untouched
        last = self.identity.lineage[-1]
        self.identity.lineage[-1] = {**last, "check": selfcheck.signed(summary)}

    @property
    def run_id(self) -> str:
        """The run's id (kept across resumes; new for a fresh or warm-started run)."""
        return self.identity.run_id

    @property
    def resumed_from(self) -> Path | None:
        """The checkpoint this process resumed from, if it did."""
        return self.identity.resumed_from

    def _release(self, *, tidy: bool = False) -> None:
        """Stop watching (a resume check not finished says how far it got), uninstall the
        guard the checkpointer installed, drop the lock (``tidy``: a refused start, see
        :meth:`~recovery.integrity.lock.RunLock.release`)."""
        if self._check is not None:
            self._check.finish()
            self._check = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if self._owned[1] and self.preemption is not None:
            self.preemption.uninstall()
        if self._lock is not None:
            self._lock.release(tidy=tidy)
            self._lock = None

    def _journal_path(self) -> Path:
        # ranks > 0 journal nothing but read the same file: every rank takes one decision
        return self.journal.path or self.run_dir / METRICS_FILE

    def _event(self, record: dict[str, Any]) -> None:
        self.journal.write(record)


def defaults(
    cfg: CheckpointConfig,
    run_dir: Path,
    world: World,
    *,
    journal: Journal | None,
    preemption: PreemptionGuard | bool | None,
    health: HealthConfig | bool | None,
) -> tuple[Journal, PreemptionGuard | None, HealthConfig | None, tuple[bool, bool]]:
    """The checkpointer's journal, preemption guard and health settings, defaults filled in.

    - ``journal=None``: ``<run_dir>/metrics.jsonl`` (rank 0; other ranks discard).
    - ``preemption=None`` or ``True``: a guard for ``cfg.preempt_signals`` (SIGTERM,
      SIGUSR1), installed by ``restore`` on the main thread, uninstalled by ``close``;
      ``False``: none; a guard: used as given (its owner installs it).
    - ``health=None`` or ``True``: :class:`~recovery.config.HealthConfig` defaults;
      ``False``: no monitor of the checkpointer's own.

    Returns:
        The journal, the guard, the health settings, and which of journal and guard it made.
    """
    made_journal = journal is None
    if journal is None:
        journal = Journal(run_dir / METRICS_FILE if world.leader else None)
    made_guard = preemption is None or preemption is True
    guard = preemption if isinstance(preemption, PreemptionGuard) else None
    if made_guard:
        guard = PreemptionGuard(cfg.preempt_signals)
    settings = health if isinstance(health, HealthConfig) else None
    if health is None or health is True:
        settings = HealthConfig()
    return journal, guard, settings, (made_journal, made_guard)
