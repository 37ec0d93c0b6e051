"""``checkpoint.cluster.*``: the batch scheduler a run is under, and what the run does about it."""

from __future__ import annotations

from dataclasses import dataclass

from recovery.config.checks import check_signals, one_of, refuse

SCHEDULERS = ("auto", "slurm", "none")
"""``checkpoint.cluster.scheduler``: detect from the environment, require SLURM, ignore it."""
REQUEUES = ("never", "time_limit", "always")
"""``checkpoint.cluster.requeue``: when a run requeues its own job after a checkpointed stop."""


@dataclass(kw_only=True)
class ClusterConfig:
    """The batch scheduler (SLURM) a run is under (:mod:`recovery.run.scheduling.slurm`)."""

    scheduler: str = "auto"
    """``auto``: SLURM when the process runs in a SLURM job (``SLURM_JOB_ID`` is set);
    ``slurm``: the same, and a start outside a SLURM job is refused; ``none``: the
    environment is ignored (no job name, no ``job`` event, no requeue)."""
    time_limit_signal: str | None = "SIGUSR1"
    """The preemption signal the scheduler sends before the time limit (``sbatch
    --signal=USR1@120``): a stop on it is journaled as "time limit"; ``null``: none is."""
    requeue: str = "never"
    """After a checkpointed preemption the run requeues its own job (``scontrol requeue``)
    once its journal is closed: ``never`` (the scheduler or the job script does);
    ``time_limit``: after a stop on ``time_limit_signal`` (SLURM never requeues a job that
    reached its time limit); ``always``: after any checkpointed preemption (a job
    submitted with ``--no-requeue``; an ``scancel`` then requeues too)."""

    def __post_init__(self) -> None:
        one_of("checkpoint.cluster.scheduler", self.scheduler, SCHEDULERS)
        one_of("checkpoint.cluster.requeue", self.requeue, REQUEUES)
        if self.time_limit_signal is not None:
            check_signals("checkpoint.cluster.time_limit_signal", [self.time_limit_signal])
        elif self.requeue == "time_limit":
            raise refuse(
                "checkpoint.cluster.time_limit_signal",
                "requeue=time_limit needs the signal the scheduler sends before the time "
                "limit, got null",
                "SIGUSR1",
            )
        if self.requeue != "never" and self.scheduler == "none":
            raise refuse(
                "checkpoint.cluster.requeue",
                f"{self.requeue} requeues the job through its scheduler, but "
                "checkpoint.cluster.scheduler=none ignores it",
                "never",
            )

    def check_caught(self, preempt_signals: list[str]) -> None:
        """A run that requeues on the time limit must catch its signal (else the signal
        ends the process before any checkpoint).

        Raises:
            ConfigError: ``requeue=time_limit`` and ``time_limit_signal`` is not one of
                ``preempt_signals``.
        """
        signal_ = self.time_limit_signal
        if self.requeue == "time_limit" and signal_ not in preempt_signals:
            raise refuse(
                "checkpoint.preempt_signals",
                f"{list(preempt_signals)} lacks checkpoint.cluster.time_limit_signal "
                f"{signal_}, which checkpoint.cluster.requeue=time_limit waits for (uncaught, "
                "it would end the run before any checkpoint)",
                "[" + ",".join([*preempt_signals, str(signal_)]) + "]",
            )
