"""The run's batch-scheduler job: each start journaled, the job requeued after a preemption.

At each start under a scheduler (``checkpoint.cluster.scheduler``;
:mod:`recovery.run.scheduling.slurm` reads the job from the environment) rank 0
journals one informational ``job`` event once the run has begun: the job id, its
restart count, the node, and how the process before stopped as the journal
recorded it (time limit, preempted/requeued, killed, ended). After a checkpointed
preemption, :meth:`BatchJob.requeue_after` requeues the job when
``checkpoint.cluster.requeue`` asks (:mod:`recovery.run.scheduling.requeue`); the
checkpointer calls it once it is closed.
"""

from __future__ import annotations

import logging
import os
from functools import cached_property
from pathlib import Path
from typing import Any

from recovery.config import ClusterConfig
from recovery.errors import ConfigError, Preempted
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.run.journal import Journal, read
from recovery.run.scheduling import requeue, slurm

log = logging.getLogger(__name__)


class BatchJob:
    """Journals each start of the run under a scheduler job, and requeues the job after a
    checkpointed preemption.

    Args:
        cluster: ``checkpoint.cluster``.
        preempt_signals: ``checkpoint.preempt_signals`` (ignored once a requeue is asked).
        run_dir: the run directory (named in a refusal).
        journal: the run's journal (rank 0 writes; every rank reads ``journal_path``).
        journal_path: where the journal lies, on every rank.
        world: this process's rank and the job's size.
        final_step: the run's last step.
    """

    def __init__(
        self,
        cluster: ClusterConfig,
        preempt_signals: list[str],
        *,
        run_dir: Path,
        journal: Journal,
        journal_path: Path,
        world: World,
        final_step: int,
    ) -> None:
        self.cluster = cluster
        self.preempt_signals = preempt_signals
        self.run_dir = run_dir
        self.journal = journal
        self.journal_path = journal_path
        self.world = world
        self.final_step = final_step
        self._before: tuple[tuple[str, str | None] | None, dict[str, Any] | None] | None = None
        self._requeued = False

    @cached_property
    def job(self) -> slurm.Job | None:
        """This process's scheduler job (``None``: none, or ``checkpoint.cluster.scheduler=none``).

        Raises:
            ConfigError: ``checkpoint.cluster.scheduler=slurm`` outside a SLURM job.
        """
        return slurm.detect(os.environ, self.cluster.scheduler)

    def starting(self) -> None:
        """Before the run begins: read how the process before stopped (rank 0).

        Raises:
            ConfigError: not under a SLURM job with ``scheduler=slurm``; or a second run
                in the same job instance would resume the first's finished run
                (:func:`~recovery.run.scheduling.slurm.ran_to_end`). Nothing is touched.
        """
        job = self.job
        if job is None:
            self._before = None
            return
        records = self._records() if self.world.leader else []
        self._refuse_a_second_run(job, records)
        before = slurm.previous_stop(records, self.cluster.time_limit_signal)
        self._before = (before, slurm.previous_job(records))

    def started(self, step: int) -> None:
        """Once the run has begun at ``step``: the ``job`` event and one info line (rank 0)."""
        job = self.job
        if job is None or self._before is None:
            return
        before, previous = self._before
        other = previous.get("job_id") if previous is not None else None
        record = slurm.event(job, before, step, other if isinstance(other, str) else None)
        self.journal.write(record)
        log.info("%s, at step %d", slurm.describe(record), step)

    def _records(self) -> list[dict[str, Any]]:
        path = self.journal_path
        return read(path) if path.is_file() else []

    def _refuse_a_second_run(self, job: slurm.Job, records: list[dict[str, Any]]) -> None:
        ended = slurm.ran_to_end(records, job, self.final_step)
        if not distributed.any_of(ended is not None)[0]:  # rank 0 read it; all refuse
            return
        raise ConfigError(
            f"run.name: {job.describe} already ran {self.run_dir.name} to its end "
            f"(step {ended if ended is not None else '?'}) earlier in this job; every run of "
            "a job shares the job's name, so this one would only resume that one: pass "
            "run.name=<a name of its own> to each run of a multi-run job"
        )

    def requeue_after(self, err: BaseException | None) -> bool:
        """Requeue this job (rank 0, once) when ``err``, which ended the run, is a
        checkpointed preemption that ``checkpoint.cluster.requeue`` requeues.

        Call it after the checkpointer and its journal are closed: ``scontrol requeue``
        sends this process SIGTERM, which it ignores from then on. ``True``: requeued.
        """
        job = self.job
        if (
            not isinstance(err, Preempted)
            or job is None
            or self._requeued
            or not self.world.leader
            or not slurm.should_requeue(self.cluster, err.signal_name)
        ):
            return False
        self._requeued = True
        return requeue.requeue(job, also_ignore=self.preempt_signals)
