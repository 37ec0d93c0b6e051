"""The checkpointer: one run's checkpoints, from its start to its end, as one object.

:class:`Checkpointer` is a facade: it holds parts that each do one thing, which
:func:`~recovery.run.assembly.assemble` builds from the config and wires, and
delegates to them. :class:`~recovery.run.restoring.sequence.Restorer` begins the run
(choose, verify, load, self-check); :class:`~recovery.run.saving.boundary.Saves`
takes each step's decision and writes through the local tier (:mod:`recovery.run.tiers`)
or the save strategy (:mod:`recovery.run.writing.strategies`);
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
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from recovery import console
from recovery.config import CheckpointConfig, HealthConfig, parse_duration
from recovery.errors import RecoveryError
from recovery.integrity.keys.signing import Signer, TrustStore
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.provenance.purpose import PurposeSpec
from recovery.run import exits
from recovery.run.assembly import assemble
from recovery.run.journal import Journal
from recovery.run.saving.boundary import Metrics
from recovery.run.scheduling import slurm
from recovery.run.scheduling.preemption import PreemptionGuard
from recovery.run.status import Identity
from recovery.state.registry import TrainState

log = logging.getLogger(__name__)


class Checkpointer:
    """Saves and restores one run's :class:`TrainState`, signed, with provenance and lineage.

    Args:
        cfg: checkpoint settings.
        run_dir: ``<checkpoint.root>/<run.name>`` (a ``str`` or any path-like).
        final_step: the run's last step; a checkpoint is always written there.
        signer: signs every artifact; default: as the CLI resolves it
            (``$RECOVERY_SIGNING_KEY``, else the dev key: :mod:`recovery.integrity.keys.trust`).
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
            ``health`` of its own (:mod:`recovery.run.monitoring.watch`); ``False``: none.
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
        self.cfg = cfg
        self.world = world
        self.run_dir = run_dir = Path(run_dir)
        self.root = run_dir.parent
        parts = assemble(
            cfg,
            run_dir,
            final_step=final_step,
            signer=signer,
            trust=trust,
            allow_untrusted=allow_untrusted,
            provenance=provenance,
            config=config,
            model_config=model_config,
            purposes=purposes,
            journal=journal,
            preemption=preemption,
            health=health,
            world=world,
            seed=seed,
            strategy=strategy,
        )
        self.signer = parts.signer
        self.trust = parts.trust
        """Whose artifacts load, and whose seals on the journal's steering events count."""
        self.config = parts.config
        self.provenance = parts.provenance
        self.journal = parts.journal
        self.preemption = parts.preemption
        self.status = parts.status
        """The run's identity and progress, which the parts share."""
        self.cadence = parts.cadence
        self.publisher = parts.publisher
        self.local = parts.local
        """The local tier (``checkpoint.local``), or ``None``: :mod:`recovery.run.tiers`."""
        self._owns_journal = parts.owns_journal
        self._reaper = parts.reaper
        self._restorer = parts.restorer
        self._saves = parts.saves
        self._batch = parts.batch
        self._created = time.perf_counter()
        self._closed = False

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
