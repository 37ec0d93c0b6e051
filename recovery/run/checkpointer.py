"""The checkpointer: one run's checkpoints, from its start to its end, as one object.

:class:`Checkpointer` is a facade over parts that each do one thing, built here
from the config and handed what they need: :class:`~recovery.run.restoring.restorer.Restorer`
begins the run (choose, verify, load, self-check);
:class:`~recovery.run.saving.saves.Saves` takes each step's decision and writes
through the local tier (:mod:`recovery.run.tiers`) or the save strategy
(:mod:`recovery.run.writing.strategies`);
:class:`~recovery.run.saving.aftercommit.AfterCommit` does what follows a commit;
:class:`~recovery.run.scheduling.batchjob.BatchJob` journals the scheduler job and
requeues it. They share one :class:`~recovery.run.status.RunStatus`.
``docs/dev/layout.md`` draws the save and resume paths through them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from recovery import console
from recovery.config import CheckpointConfig, HealthConfig, SigningConfig, parse_duration
from recovery.errors import RecoveryError
from recovery.format.layout import METRICS_FILE
from recovery.integrity import trust as keys
from recovery.integrity.reaping import Reaper
from recovery.integrity.signing import Signer, TrustStore
from recovery.parallel import multirank
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.provenance import capture as prov
from recovery.provenance.purpose import BUILTIN, PurposeSpec
from recovery.provenance.recordable import recordable
from recovery.run import exits
from recovery.run.journal import Journal
from recovery.run.restoring.restorer import Restorer
from recovery.run.saving.aftercommit import AfterCommit
from recovery.run.saving.saves import Metrics, Saves
from recovery.run.scheduling import slurm
from recovery.run.scheduling.batchjob import BatchJob
from recovery.run.scheduling.cadence import Cadence
from recovery.run.scheduling.preemption import PreemptionGuard
from recovery.run.status import Identity, RunStatus, Trust
from recovery.run.tiers import rules
from recovery.run.tiers.localtier import LocalTier
from recovery.run.writing import job as job_mod
from recovery.run.writing import strategies
from recovery.run.writing.differential import Differential
from recovery.state.registry import TrainState
from recovery.storage import gitignored, tracking

log = logging.getLogger(__name__)


class Checkpointer:
    """Saves and restores one run's :class:`TrainState`, signed, with provenance and lineage.

    Args:
        cfg: checkpoint settings.
        run_dir: ``<checkpoint.root>/<run.name>`` (a ``str`` or any path-like).
        final_step: the run's last step; a checkpoint is always written there.
        signer: signs every artifact; default: as the CLI resolves it
            (``$RECOVERY_SIGNING_KEY``, else the dev key: :mod:`recovery.integrity.trust`).
        trust: keys whose artifacts may be loaded; default: the trust store of
            :class:`~recovery.config.SigningConfig` and the signer's own key.
        allow_untrusted: also load artifacts by other signers (signature still checked).
        provenance: :func:`recovery.provenance.capture.capture` of this process (captured
            here if not given).
        config: the resolved config with secrets redacted (``config.yaml``, drift): a dict
            or an ``argparse.Namespace`` (paths recorded as strings); default: the
            command line (:mod:`recovery.provenance.recordable`).
        model_config: what rebuilds the model (stored for warm starts).
        purposes: contracts by purpose name; default :data:`recovery.provenance.purpose.BUILTIN`.
        journal: the run's ``metrics.jsonl`` (default ``<run_dir>/metrics.jsonl``): start,
            resume, warning and checkpoint-cost events and the per-step records
            (:meth:`record`) go there.
        preemption: the run's signal guard; a request turns into a checkpoint and
            :class:`~recovery.errors.Preempted` at the next step boundary. Default: one
            for ``cfg.preempt_signals``, installed by :meth:`restore` (main thread
            only) and uninstalled by :meth:`close`; ``False``: no signals are caught.
        health: the resume health monitor's settings (default
            :class:`~recovery.config.HealthConfig`), used when the state registers no
            ``health`` of its own (:mod:`recovery.run.watch`); ``False``: none.
        world: this process's rank and the job's size (``torchrun``); every rank
            runs a checkpointer, rank 0 alone commits (:mod:`recovery.parallel.multirank`).
        seed: the run's seed, from which a resume on another world size reseeds.
        strategy: the job's parallelism (``ddp``/``fsdp``), recorded in checkpoints.
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        run_dir: str | os.PathLike[str],
        *,
        final_step: int,
        signer: Signer | None = None,
        trust: TrustStore | None = None,
        allow_untrusted: bool = False,
        provenance: dict[str, Any] | None = None,
        config: Mapping[str, Any] | object | None = None,
        model_config: dict[str, Any] | None = None,
        purposes: Mapping[str, PurposeSpec] | None = None,
        journal: Journal | None = None,
        preemption: PreemptionGuard | bool | None = None,
        health: HealthConfig | bool | None = None,
        world: World = distributed.SINGLE,
        seed: int = 0,
        strategy: str = "ddp",
    ) -> None:
        if world.leader:  # a script that set up no logging still hears its resume, once
            console.show()
        multirank.check_supported(
            world,
            async_save=cfg.async_save,
            warm_start_every=cfg.warm_start_every,
            hash_type=cfg.hash,
            differential=cfg.differential.enabled,
        )
        if cfg.local.enabled:
            rules.check_supported(differential=cfg.differential.enabled)
        self.cfg = cfg
        self.world = world
        self.run_dir = run_dir = Path(run_dir)
        self.root = run_dir.parent
        self.signer = signer = (
            signer if signer is not None else keys.resolve_signer(SigningConfig())
        )
        trust = trust if trust is not None else keys.resolve_trust(SigningConfig(), signer)
        self.trust = Trust(trust, trust.with_signer(signer), allow_untrusted)
        """Whose artifacts load, and whose seals on the journal's steering events are
        believed: the trust store and this writer's own key (:mod:`recovery.integrity.seal`)."""
        self.config = recordable(config)
        self.provenance = provenance if provenance is not None else prov.capture(config=self.config)
        self.journal, self.preemption, health, owned = _defaults(
            cfg, run_dir, world, journal=journal, preemption=preemption, health=health
        )
        self.journal.seal_with(signer, self.trust.events)
        self._owns_journal = owned[0]
        self.status = RunStatus(Identity(run_id=uuid.uuid4().hex, lineage=[]))
        """The run's identity and progress, shared by the parts below; a restore replaces
        the identity."""
        self.cadence = Cadence(cfg, final_step=final_step)
        self.publisher = self._publisher()
        self._reaper = Reaper()
        committed = AfterCommit(
            cfg,
            run_dir,
            status=self.status,
            cadence=self.cadence,
            journal=self.journal,
            signer_id=signer.key_id,
            trust=self.trust,
            publisher=self.publisher,
            reaper=self._reaper,
        )
        saver = strategies.choose(
            async_save=cfg.async_save,
            world=world,
            strategy=strategy,
            signer=signer,
            committed=committed,
        )
        self.local = (
            LocalTier(
                cfg.local,
                run_dir,
                rank=world.rank,
                signer=signer,
                committed=committed,
                event=self.journal.write,
                async_save=cfg.async_save,
                world=world,
                ranks=saver if isinstance(saver, strategies.Ranks) else None,
            )
            if cfg.local.enabled
            else None
        )
        """The local tier (``checkpoint.local``), or ``None``: :mod:`recovery.run.tiers`."""
        differential = Differential(cfg.differential)
        guard = self.preemption if owned[1] else None  # installed and uninstalled here
        purposes = dict(purposes or BUILTIN)
        self._restorer = Restorer(
            cfg,
            run_dir,
            status=self.status,
            journal=self.journal,
            trust=self.trust,
            world=world,
            seed=seed,
            provenance=self.provenance,
            config=self.config,
            purposes=purposes,
            local=self.local,
            differential=differential,
            final_step=final_step,
            health=health,
            guard=guard,
        )
        self._saves = Saves(
            cfg,
            run_dir,
            status=self.status,
            cadence=self.cadence,
            differential=differential,
            strategy=saver,
            local=self.local,
            guard=self.preemption,
            journal=self.journal,
            signer=signer,
            committed=committed,
            purposes=purposes,
            carried=job_mod.Carried(
                provenance=self.provenance,
                config_yaml=yaml.safe_dump(self.config, sort_keys=False),
                model_config=model_config,
                world_size=world.size,
            ),
            watch=lambda: self._restorer.watch,
        )
        self._batch = BatchJob(
            cfg.cluster,
            cfg.preempt_signals,
            run_dir=run_dir,
            journal=self.journal,
            journal_path=self._restorer.journal_path,
            world=world,
            final_step=final_step,
        )
        self._created = time.perf_counter()
        self._closed = False

    def _publisher(self) -> tracking.Publisher | None:
        """DVC's tracking of each commit (``checkpoint.dvc``; rank 0, in a DVC repository,
        a run directory git does not ignore)."""
        cfg, run_dir = self.cfg, self.run_dir
        repo = tracking.find_repo(run_dir) if cfg.dvc.enabled and self.world.leader else None
        if repo is not None and (why := gitignored.git_ignored(repo, run_dir)):
            log.warning("%s", gitignored.not_registered(run_dir, why))  # once, not per checkpoint
            repo = None
        if repo is None:
            return None
        return tracking.Publisher(repo, push=cfg.dvc.push, remote=cfg.dvc.remote)

    # -- the run's identity and progress ---------------------------------------------

    @property
    def identity(self) -> Identity:
        """The run's id, lineage and links (a restore replaces it)."""
        return self.status.identity

    @property
    def run_id(self) -> str:
        """The run's id (kept across resumes; new for a fresh or warm-started run)."""
        return self.status.identity.run_id

    @property
    def resumed_from(self) -> Path | None:
        """The checkpoint this process resumed from, if it did."""
        return self.status.identity.resumed_from

    @property
    def last_saved(self) -> int | None:
        """The newest step saved (committed or still being written), or resumed from."""
        return self.status.last_saved

    @property
    def persisted(self) -> int | None:
        """The step of the newest checkpoint committed in the run directory (or resumed from
        there): not a save merely submitted."""
        return self.status.persisted

    @property
    def pause_s(self) -> float:
        """Time the training thread spent on checkpoints (sync saves, async pauses and waits)."""
        return self.status.pause_s

    @property
    def job(self) -> slurm.Job | None:
        """This process's scheduler job (``None``: none, or ``checkpoint.cluster.scheduler=none``).

        Raises:
            ConfigError: ``checkpoint.cluster.scheduler=slurm`` outside a SLURM job.
        """
        return self._batch.job

    # -- restore ----------------------------------------------------------------------

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
        the run is watched and (by default) preemption signals are caught. Under a
        scheduler job, rank 0 journals the ``job`` event last.

        Raises:
            ConfigError: ``checkpoint.cluster.scheduler=slurm`` outside a SLURM job, or
                a second run in the same job instance would resume the first's
                finished run (both before anything is touched).
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
        self._batch.starting()
        step = self._restorer.restore(state, resume_spec, init_from)
        self._batch.started(step)
        return step

    def record(self, step: int, **fields: Any) -> None:
        """Write the per-step record of optimizer step ``step`` to the run's journal.

        ``fields``: ``loss=`` (what the resume health monitor judges), ``epoch=``,
        ``batch=``, ...; ``lr`` (the rate the step used) and ``update`` (the health
        probe's update size) are added when the checkpointer measured them.
        """
        self.journal.step(step, **fields)

    # -- save -------------------------------------------------------------------------

    def maybe_save(self, state: TrainState, step: int, *, metrics: Metrics = None) -> Path | None:
        """Call after every optimizer step: save if due; return the checkpoint's path or ``None``.

        ``metrics`` may be a callable, evaluated only when a checkpoint is written
        (an evaluation pass costs nothing on the other steps).

        On its way out it is the :mod:`recovery.faults` point ``step-<step>``, so a drill
        kills any loop that calls it between steps, as it kills the recipes.

        Raises:
            CommitError: a background save failed (raised at the first step after it did).
            Preempted: a preemption signal arrived; a checkpoint of ``step`` is committed.
        """
        return self._saves.maybe_save(state, step, metrics=metrics)

    def save(
        self,
        state: TrainState,
        step: int,
        *,
        metrics: dict[str, Any] | None = None,
        sync: bool = False,
    ) -> Path:
        """Snapshot ``state`` at ``step`` as a continuation checkpoint; commit; retain.

        Where it is written was chosen at construction (:mod:`recovery.run.writing.strategies`):
        with ``checkpoint.async`` (and not ``sync``) the state is copied into the
        staging buffers and the rest happens on the background thread; the path
        is returned before it is committed (:meth:`flush` waits).

        Raises:
            PurposeError: ``state`` lacks what a continuation checkpoint requires.
            CommitError: this (sync) or the previous (async) save failed.
        """
        return self._saves.save(state, step, metrics=metrics, sync=sync)

    def save_warm_start(
        self, state: TrainState, step: int, *, metrics: dict[str, Any] | None = None
    ) -> Path:
        """Write a warm-start artifact (weights + model config) under ``warm_start/``, now."""
        return self._saves.save_warm_start(state, step, metrics=metrics)

    def flush(self) -> None:
        """Wait until the save or promotion in flight (if any) is committed, and the
        checkpoints retention retired are deleted.

        Raises:
            CommitError: it failed.
        """
        try:
            self._saves.flush()
        finally:
            self._reaper.close()

    # -- the end ----------------------------------------------------------------------

    def close(self) -> None:
        """Finish the writes in flight, record the run's costs, release what the run held.

        Also judges a resume-health window the run ended inside, stops watching,
        uninstalls the preemption guard and closes the journal, where the
        checkpointer made them. Once: a second call does nothing.

        Raises:
            CommitError: the last background save or promotion failed.
        """
        if self._closed:  # once: a with-block closes what an explicit close() closed
            return
        self._closed = True
        failed = True
        try:
            self._saves.close()
            failed = False
        finally:
            self._reaper.close()  # retired directories fully deleted before the run ends
            self._restorer.release()
            if self.publisher is not None:
                self.publisher.close(parse_duration(self.cfg.dvc.close_timeout))
            summary = self.cadence.summary(time.perf_counter() - self._created, self.pause_s)
            # the saver's error is the run's: a summary the same full disk refuses must not
            # replace it
            with contextlib.suppress(*((RecoveryError, OSError) if failed else ())):
                self.journal.write(summary)
            if self._owns_journal:
                self.journal.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    def requeue_after(self, err: BaseException | None) -> bool:
        """After ``err`` ended the run: when it is a checkpointed preemption that
        ``checkpoint.cluster.requeue`` requeues, requeue this job (rank 0, once); call it
        after :meth:`close` and after the journal is closed (``scontrol requeue`` sends
        this process SIGTERM, which it ignores from then on). ``True``: requeued."""
        return self._batch.requeue_after(err)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close; a library error leaving the block ends the process with its exit code and
        one line (:class:`~recovery.errors.Preempted`: ``checkpoint.preempt_exit_code``; with
        ``checkpoint.cluster.requeue`` the SLURM job is requeued first); anything else
        propagates."""
        try:
            self.close()
        except RecoveryError as failed:  # the last background save failed
            if not isinstance(err, RecoveryError):
                err = failed
        if isinstance(err, RecoveryError):
            code = exits.report(err)
            self.requeue_after(err)  # closed: the journal has its last record
            raise SystemExit(code) from err

    def exit_on_error(self) -> None:
        """For a loop at module level, without a with-block: from now on an uncaught library
        error (:class:`~recovery.errors.Preempted` included) closes this checkpointer, prints
        one line and ends the process with its exit code, as the with-block does. Other
        exceptions keep Python's own handling. Call it on the main thread.
        """
        exits.install_hook(self.close, self.requeue_after)


def _defaults(
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
