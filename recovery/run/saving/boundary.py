"""What a step boundary saves: nothing, a local snapshot, a checkpoint, a warm-start
artifact, or a preemption's checkpoint.

:class:`Saves` takes the decision once per optimizer step (every rank alike: one
collective), builds the :class:`~recovery.run.writing.job.SaveJob` and hands it to
where it is written: the local tier when there is one
(:mod:`recovery.run.tiers.snapshots`: a snapshot in RAM, then its promotion), else the
save strategy chosen at start (:mod:`recovery.run.writing.strategies`). What follows
the commit is :class:`~recovery.run.saving.aftercommit.AfterCommit`, which both report
to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from recovery import faults
from recovery.config import CheckpointConfig
from recovery.errors import CommitError, Preempted, PurposeError
from recovery.format.layout import WARM_START_DIR, step_dir_name
from recovery.integrity.keys.signing import Signer
from recovery.parallel import world as distributed
from recovery.provenance import purpose
from recovery.provenance.purpose import PurposeSpec
from recovery.run.journal import Journal
from recovery.run.monitoring.watch import Watch
from recovery.run.saving import retention
from recovery.run.scheduling import cadence as cadence_mod
from recovery.run.scheduling.cadence import Cadence
from recovery.run.scheduling.preemption import PreemptionGuard, agreed
from recovery.run.status import RunStatus
from recovery.run.tiers.snapshots import LocalTier
from recovery.run.writing import job as job_mod
from recovery.run.writing import strategies
from recovery.run.writing.differential import Differential, Plan
from recovery.run.writing.job import SaveJob
from recovery.state import wrapping
from recovery.state.registry import MODEL, TrainState

Metrics = dict[str, Any] | Callable[[], dict[str, Any]] | None


class Saves:
    """Saves the run's state when a step is due, preempted or a milestone, through the
    local tier or the save strategy, and waits for the writes in flight.

    Args:
        cfg: the checkpoint settings.
        run_dir: the run directory (checkpoints are ``step-N`` in it).
        status: the run's shared status (identity, steps saved, time spent).
        cadence: when a checkpoint is due.
        differential: which save is a full base and which a delta.
        strategy: where a persistent save is written.
        local: the local tier (``None``: none).
        guard: the preemption guard whose request turns into a checkpoint (``None``: none).
        journal: the run's journal.
        signer: signs a warm-start artifact.
        committed: what follows a commit (for a warm-start artifact, written inline).
        purposes: the contracts by purpose name.
        carried: what every save job carries (provenance, config, model config).
        watch: the run's watch once it has begun (``None`` before, or without one).
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        run_dir: Path,
        *,
        status: RunStatus,
        cadence: Cadence,
        differential: Differential,
        strategy: strategies.Inline,
        local: LocalTier | None,
        guard: PreemptionGuard | None,
        journal: Journal,
        signer: Signer,
        committed: strategies.Committed,
        purposes: Mapping[str, PurposeSpec],
        carried: job_mod.Carried,
        watch: Callable[[], Watch | None],
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.status = status
        self.cadence = cadence
        self.differential = differential
        self.strategy = strategy
        self.local = local
        self.guard = guard
        self.journal = journal
        self.signer = signer
        self.committed = committed
        self.purposes = purposes
        self.carried = carried
        self.watch = watch
        self._first_step = True

    def maybe_save(self, state: TrainState, step: int, *, metrics: Metrics = None) -> Path | None:
        """After optimizer step ``step``: save what is due; return the checkpoint's path or
        ``None`` (see :meth:`Checkpointer.maybe_save
        <recovery.run.checkpointer.Checkpointer.maybe_save>`)."""
        if self._first_step:
            self._first_step = False
            resumed = self.status.identity.resumed_from is not None
            self.journal.write(cadence_mod.first_step(step, resumed=resumed))
        every = self.cfg.warm_start_every
        milestone = every > 0 and step % every == 0
        preempt = self.guard is not None and self.guard.requested is not None
        # every rank must take the same decisions (whether to save, whether a background
        # save failed somewhere): one collective a step (a no-op for one process)
        failed, running = self.strategy.status()
        # a snapshot still written skips the one due: on every rank alike (peer replicas)
        busy = self.local is not None and self.local.due(step) and self.local.busy()
        broken = self.local is not None and self.local.failed()
        preempt, due, failed, running, busy, broken = distributed.any_of(
            preempt, self.cadence.due(step), failed, running, busy, broken
        )
        self.strategy.settle(failed=failed, running=running)
        path = None
        if self.local is not None:
            if broken:  # a snapshot's, a promotion's or a copy's failure: on every rank
                self.local.raise_if_failed()
                raise CommitError(
                    f"step {step}: another rank's local snapshot or its copy to a peer "
                    "failed (that rank's log says why); the job stops on every rank. "
                    "Requeue it: it resumes from the newest step that verifies.",
                    path=self.local.dir,
                )
            if self.local.due(step) and not (preempt or due):
                if busy:
                    self.local.skipped += 1
                else:
                    self._snapshot(state, step)
        if preempt or milestone or due:
            values = self._metrics(metrics, step)
            if preempt:
                self._preempt(state, step, values)
            if milestone:
                self.save_warm_start(state, step, metrics=values)
            if due:
                path = self.save(state, step, metrics=values)
        faults.reach(f"step-{step}")  # after the step and its save: where a drill kills
        return path

    def _metrics(self, metrics: Metrics, step: int) -> dict[str, Any] | None:
        if not callable(metrics):
            return metrics
        watch = self.watch()
        return watch.evaluate(metrics, step) if watch is not None else metrics()

    def save(
        self,
        state: TrainState,
        step: int,
        *,
        metrics: dict[str, Any] | None = None,
        sync: bool = False,
    ) -> Path:
        """A continuation checkpoint of ``state`` at ``step``: through the local tier
        (promoted from its snapshot) unless ``sync``, else the save strategy; return its
        path, committed or (written in the background) not yet.

        Raises:
            PurposeError: ``state`` lacks what a continuation checkpoint requires.
            CommitError: this (sync) or the previous (async) save failed.
        """
        retention.check_metric(self.cfg, metrics)  # before the step counts as saved
        final = self.run_dir / step_dir_name(step)
        self.cadence.saved(step)
        waited = self.strategy.wait() + (self.local.wait() if self.local is not None else 0.0)
        self.status.pause_s += waited
        job = self._job(
            final,
            step,
            purpose.CONTINUATION,
            metrics,
            expect=state.expectations(step),
            absent=state.absent,
            differential=self.differential.plan(),
        )
        # promoted from its local snapshot (under torchrun, every rank's: collectively)
        if self.local is not None and not sync:
            self.status.pause_s += self.local.save(job, state, waited=waited)
        else:
            self.status.pause_s += self.strategy.save(job, state, waited=waited, sync=sync)
        self.status.last_saved = step
        self._saved(step)
        return final

    def _saved(self, step: int) -> None:
        watch = self.watch()
        if watch is not None:  # what must not change before the next optimizer step
            watch.saved(step)

    def _snapshot(self, state: TrainState, step: int) -> None:
        """A local-tier snapshot of ``step`` (not a persistent checkpoint)."""
        assert self.local is not None
        job = self._job(
            self.run_dir / step_dir_name(step),
            step,
            purpose.CONTINUATION,
            None,
            expect=state.expectations(step),
            absent=state.absent,
        )
        self.status.pause_s += self.local.snapshot(job, state)
        self._saved(step)

    def save_warm_start(
        self, state: TrainState, step: int, *, metrics: dict[str, Any] | None = None
    ) -> Path:
        """A warm-start artifact (weights and model config) under ``warm_start/``, written
        now on this thread; return its path.

        Raises:
            PurposeError: ``state`` registers no ``model``.
        """
        model = state.components.get(MODEL)
        if model is None:
            raise PurposeError("warm-start artifacts need a registered 'model'", missing=[MODEL])
        final = self.run_dir / WARM_START_DIR / step_dir_name(step)
        final.parent.mkdir(exist_ok=True)
        job = self._job(final, step, purpose.WARM_START, metrics, chained=False)
        # inline whatever the strategy: a milestone copy is rare, and must not wait its turn
        weights = {MODEL: wrapping.canonical(model.state_dict())}
        strategies.Inline(self.signer, self.committed).write_tree(job, weights)
        return final

    def _job(
        self,
        final: Path,
        step: int,
        purpose_name: str,
        metrics: dict[str, Any] | None,
        *,
        expect: dict[str, Any] | None = None,
        chained: bool = True,
        absent: dict[str, str] | None = None,
        differential: Plan | None = None,
    ) -> SaveJob:
        return job_mod.build(
            final,
            step,
            purpose_name=purpose_name,
            requires=self.purposes[purpose_name].requires,
            identity=self.status.identity,
            carried=self.carried,
            metrics=metrics,
            interval=self.cadence.describe(),
            expect=expect,
            chained=chained,
            absent=absent,
            shard_bytes=self.cfg.shard_bytes,
            hash_type=self.cfg.hash,
            differential=differential,
        )

    def _preempt(self, state: TrainState, step: int, metrics: dict[str, Any] | None) -> None:
        # under torchrun the ranks may not all have their signal yet, or not the same one:
        # they agree on it (the time limit's if any rank has it), and each joins it
        requested = self.guard.requested if self.guard is not None else None
        name = agreed(distributed.gather_text(requested or ""), self.cfg.cluster.time_limit_signal)
        if name is not None and self.guard is not None:
            self.guard.join(name)
        signal_name = name or "a peer rank's preemption"
        if self.status.last_saved != step:
            self.save(state, step, metrics=metrics, sync=True)
        else:  # that step's save, or its promotion, committed before it is said to be
            self.status.pause_s += self.strategy.wait() + (self.local.wait() if self.local else 0.0)
        self.journal.write({"event": "preempted", "signal": signal_name, "step": step})
        raise Preempted(
            f"{signal_name}: checkpointed step {step} in {self.run_dir}; "
            "requeue the same command (train.py: with +resume=latest)",
            step=step,
            signal_name=signal_name,
            path=self.run_dir / step_dir_name(step),
            exit_status=self.cfg.preempt_exit_code,
        )

    def flush(self) -> None:
        """Wait until the save or promotion in flight (if any) is committed.

        Raises:
            CommitError: it failed.
        """
        try:
            if self.local is not None:
                self.status.pause_s += self.local.wait()
        finally:
            self.status.pause_s += self.strategy.wait()

    def close(self) -> None:
        """Finish every write in flight and stop the writers' threads.

        With a local tier the promotion in flight finishes first, then the local
        directory is removed when its newest snapshot is a step the run directory holds
        (:attr:`~recovery.run.status.RunStatus.persisted`; a step whose promotion failed
        is not there).

        Raises:
            CommitError: the last background save or promotion failed.
        """
        try:
            if self.local is not None:
                self._close_local(self.local)
        finally:
            self.status.pause_s += self.strategy.close()

    def _close_local(self, local: LocalTier) -> None:
        try:  # first: the step the promotion in flight commits is persisted then
            self.status.pause_s += local.wait()
            # under torchrun the last persistent save may still be on its thread
            self.status.pause_s += self.strategy.wait()
        finally:  # under torchrun, ranks other than 0 know the step from the strategy
            steps = [s for s in (self.status.persisted, self.strategy.persisted) if s is not None]
            self.status.pause_s += local.close(max(steps, default=None))
