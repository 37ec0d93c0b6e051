"""The scheduler's part of :class:`~recovery.run.checkpointer.Checkpointer`: a start under
a SLURM job is journaled, and a preempted run may requeue its own job.

At each start under a scheduler (``checkpoint.cluster.scheduler``, :mod:`recovery.run.scheduler`)
rank 0 journals one informational ``job`` event once the run has begun: the job id,
its restart count, the node, and how the process before stopped as the journal
recorded it (time limit, preempted/requeued, killed, ended). After a checkpointed
preemption, :meth:`Scheduled.requeue_after` requeues the job when
``checkpoint.cluster.requeue`` asks (:mod:`recovery.run.requeue`); the with-block and
:meth:`~recovery.run.ending.Ending.exit_on_error` call it once the checkpointer is
closed.
"""

from __future__ import annotations

import logging
import os
from functools import cached_property
from typing import Any

from recovery.errors import ConfigError, Preempted
from recovery.parallel import world as distributed
from recovery.run import requeue, scheduler
from recovery.run.cadence import Cadence
from recovery.run.journal import read
from recovery.run.restoring import Restoring
from recovery.state.registry import TrainState

log = logging.getLogger(__name__)


class Scheduled(Restoring):
    """Journals a start under a scheduler job; requeues the job after a preemption."""

    _requeued: bool = False
    cadence: Cadence

    @cached_property
    def job(self) -> scheduler.Job | None:
        """This process's scheduler job (``None``: none, or ``checkpoint.cluster.scheduler=none``).

        Raises:
            ConfigError: ``checkpoint.cluster.scheduler=slurm`` outside a SLURM job.
        """
        return scheduler.detect(os.environ, self.cfg.cluster.scheduler)

    def restore(
        self,
        state: TrainState,
        resume_spec: object | None = None,
        *,
        init_from: object | None = None,
    ) -> int:
        """:meth:`Restoring.restore <recovery.run.restoring.Restoring.restore>`; then, under
        a scheduler job, the ``job`` event (rank 0).

        Raises:
            ConfigError: a second run in the same job instance would resume the first's
                finished run (:func:`~recovery.run.scheduler.ran_to_end`), before
                anything is touched.
        """
        job = self.job  # a refused scheduler=slurm refuses before anything is touched
        records = self._records() if job is not None and self.world.leader else []
        if job is not None:
            self._refuse_a_second_run(job, records)
        before = scheduler.previous_stop(records, self.cfg.cluster.time_limit_signal)
        previous = scheduler.previous_job(records)
        step = super().restore(state, resume_spec, init_from=init_from)
        if job is not None:
            other = previous.get("job_id") if previous is not None else None
            record = scheduler.event(job, before, step, other if isinstance(other, str) else None)
            self._event(record)
            log.info("%s, at step %d", scheduler.describe(record), step)
        return step

    def _records(self) -> list[dict[str, Any]]:
        path = self._journal_path()
        return read(path) if path.is_file() else []

    def _refuse_a_second_run(self, job: scheduler.Job, records: list[dict[str, Any]]) -> None:
        ended = scheduler.ran_to_end(records, job, self.cadence.final_step)
        if not distributed.any_of(ended is not None)[0]:  # rank 0 read it; all refuse
            return
        raise ConfigError(
            f"run.name: {job.describe} already ran {self.run_dir.name} to its end "
            f"(step {ended if ended is not None else '?'}) earlier in this job; every run of "
            "a job shares the job's name, so this one would only resume that one: pass "
            "run.name=<a name of its own> to each run of a multi-run job"
        )

    def requeue_after(self, err: BaseException | None) -> bool:
        """After ``err`` ended the run: when it is a checkpointed preemption that
        ``checkpoint.cluster.requeue`` requeues, requeue this job (rank 0, once); call it
        after :meth:`close` and after the journal is closed (``scontrol requeue`` sends
        this process SIGTERM, which it ignores from then on). ``True``: requeued."""
        job = self.job
        if (
            not isinstance(err, Preempted)
            or job is None
            or self._requeued
            or not self.world.leader
            or not scheduler.should_requeue(self.cfg.cluster, err.signal_name)
        ):
            return False
        self._requeued = True
        return requeue.requeue(job, also_ignore=self.cfg.preempt_signals)
