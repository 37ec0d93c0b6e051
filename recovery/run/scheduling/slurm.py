"""The batch scheduler a run is under (SLURM): which job it is, how its last run stopped.

Pure functions over the environment and the journal, table-tested:

- :func:`detect`: the SLURM job of this process from its environment (``SLURM_JOB_ID``;
  an array task is ``<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>``, since each task has a
  job id of its own; ``SLURM_RESTART_COUNT``, unset on the first run, is 0).
- :func:`run_name`: a run under SLURM is named after its job (``slurm-<job id>``,
  ``slurm-<array job id>-<task id>``), which SLURM keeps across requeues, so every
  restart continues the same run directory; a ``run.name`` set explicitly wins.
- :func:`previous_stop`: how the process before this start stopped, from what the
  journal recorded after its begin event: a ``preempted`` event on the time-limit
  signal is :data:`TIME_LIMIT`, on another signal :data:`PREEMPTED`; a ``run_summary``
  without one is :data:`ENDED` (finished, or stopped by an error); neither is
  :data:`KILLED` (nothing runs after a SIGKILL or a node failure; an uncaught exception
  that skipped the close reads the same).
- :func:`previous_job`: the ``job`` record of the process before (which job it ran in).
- :func:`ran_to_end`: an earlier run in this very job instance that ran to its end (a
  second ``train.py`` of one job script, refused by the checkpointer).
- :func:`event`: the journal's informational ``job`` record of a start (not sealed:
  no resume acts on it); a process before in another job is named (``previous_job_id``),
  and its preemption is :data:`PREEMPTED_ELSEWHERE`, no requeue of this job.
- :func:`should_requeue`: whether a checkpointed stop requeues its own job
  (``checkpoint.cluster.requeue``); :mod:`recovery.run.scheduling.requeue` does it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from recovery.config import ClusterConfig
from recovery.errors import ConfigError
from recovery.run.journal import BEGIN_EVENTS

SLURM = "slurm"
EVENT = "job"
"""The journal event of a start under a scheduler."""

TIME_LIMIT = "time limit"
PREEMPTED = "preempted/requeued"
PREEMPTED_ELSEWHERE = "preempted"
"""Preempted in another job than this start's (not requeued: a run continued by name)."""
KILLED = "killed (node failure or SIGKILL)"
ENDED = "ended"
"""How the process before a start stopped (:func:`previous_stop`)."""


@dataclass(frozen=True)
class Job:
    """A process's scheduler job, as its environment tells it."""

    scheduler: str
    job_id: str
    """``1234``, or ``1234_5`` for task 5 of array job 1234 (what ``squeue`` shows)."""
    restart: int
    """How many times the scheduler has requeued the job (0: its first run)."""
    own_id: str
    """The id ``scontrol`` takes for this job (an array task's own ``SLURM_JOB_ID``)."""
    name: str | None = None
    node: str | None = None
    """The node this process runs on (``SLURMD_NODENAME``, else the job's node list)."""
    nodes: str | None = None
    """The job's node list (``SLURM_JOB_NODELIST``), compressed as SLURM writes it."""
    task: int | None = None
    """This process's task in the job step (``SLURM_PROCID``; ``None`` outside ``srun``)."""

    @property
    def run_name(self) -> str:
        """``slurm-<job id>``, ``slurm-<array job id>-<task id>``: stable across requeues."""
        return f"{self.scheduler}-{self.job_id.replace('_', '-')}"

    @property
    def describe(self) -> str:
        """``SLURM job 1234_5 (restart 2)``."""
        return f"{self.scheduler.upper()} job {self.job_id} (restart {self.restart})"


def _int(value: str | None, default: int | None) -> int | None:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def detect(env: Mapping[str, str], setting: str = "auto") -> Job | None:
    """The SLURM job this process belongs to, from ``env``; ``None`` outside one or with
    ``setting`` ``none`` (``checkpoint.cluster.scheduler``).

    Raises:
        ConfigError: ``setting`` is ``slurm`` and ``env`` has no ``SLURM_JOB_ID``.
    """
    own = env.get("SLURM_JOB_ID", "").strip()
    if setting == "none" or (not own and setting == "auto"):
        return None
    if not own:
        raise ConfigError(
            "checkpoint.cluster.scheduler: slurm, but this process runs in no SLURM job "
            "(SLURM_JOB_ID is not set); submit it with sbatch, or set "
            "checkpoint.cluster.scheduler=auto"
        )
    array, task = env.get("SLURM_ARRAY_JOB_ID", "").strip(), env.get("SLURM_ARRAY_TASK_ID", "")
    job_id = f"{array}_{task.strip()}" if array and task.strip() else own
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or None
    return Job(
        scheduler=SLURM,
        job_id=job_id,
        restart=_int(env.get("SLURM_RESTART_COUNT"), 0) or 0,
        own_id=own,
        name=env.get("SLURM_JOB_NAME") or None,
        node=env.get("SLURMD_NODENAME") or nodes,
        nodes=nodes,
        task=_int(env.get("SLURM_PROCID"), None),
    )


def run_name(configured: str, job: Job | None, *, explicit: bool) -> str:
    """The run's name: ``configured`` when set ``explicit``-ly or outside a job, else the
    job's (:attr:`Job.run_name`)."""
    return job.run_name if job is not None and not explicit else configured


def _last_process(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The records from the last begin event on (the process before this start);
    ``None`` when there is none (a first start)."""
    last: list[dict[str, Any]] | None = None
    for rec in records:
        if rec.get("event") in BEGIN_EVENTS:
            last = [rec]
        elif last is not None:
            last.append(rec)
    return last


def previous_stop(
    records: Iterable[dict[str, Any]], time_limit_signal: str | None
) -> tuple[str, str | None] | None:
    """How the process before this start stopped, and the signal that stopped it, from
    the journal's ``records`` (in file order); ``None`` when it records no begin event
    (a first start). See the module for the causes."""
    last = _last_process(records)
    if last is None:
        return None
    stops = [rec for rec in last if rec.get("event") == "preempted"]
    if stops:
        signal = str(stops[-1].get("signal"))
        return (TIME_LIMIT if signal == time_limit_signal else PREEMPTED), signal
    return (ENDED if any(rec.get("event") == "run_summary" for rec in last) else KILLED), None


def previous_job(records: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``job`` record of the process before this start (``None``: it journaled none,
    outside a job or a first start)."""
    jobs = [rec for rec in _last_process(records) or [] if rec.get("event") == EVENT]
    return jobs[-1] if jobs else None


def ran_to_end(records: Iterable[dict[str, Any]], job: Job, final_step: int) -> int | None:
    """The step an earlier run in this same job instance (``job``'s id and restart count)
    ended at, when it ended without a preemption at ``final_step`` or later: a second
    ``train.py`` of one job script, which would only resume the first's finished run
    (the job's name is the run's). ``None``: not so (a first start, a requeue, a restart
    after a kill, a crash or a preemption, or a run left unfinished)."""
    last = _last_process(records) or []
    before = previous_job(last)
    if before is None or (before.get("job_id"), before.get("restart")) != (job.job_id, job.restart):
        return None
    kinds = {rec.get("event") for rec in last}
    if "preempted" in kinds or "run_summary" not in kinds:
        return None
    steps = [
        r["step"] for r in last if r.get("event") == "checkpoint" and isinstance(r.get("step"), int)
    ]
    return max(steps) if steps and max(steps) >= final_step else None


def event(
    job: Job,
    previous: tuple[str, str | None] | None,
    step: int,
    previous_job_id: str | None = None,
) -> dict[str, Any]:
    """The ``job`` record of a start at ``step`` (0: fresh) under ``job``; ``previous_job_id``:
    the job of the process before (its ``job`` record's). When that is another job (a run
    continued by name in a new one), the record keeps its id and a preemption there is
    ``preempted``, not a requeue of this job."""
    cause, signal = previous if previous is not None else (None, None)
    other = previous_job_id if previous_job_id not in (None, job.job_id) else None
    if other is not None and cause == PREEMPTED:
        cause = PREEMPTED_ELSEWHERE
    return {
        "event": EVENT,
        "scheduler": job.scheduler,
        "job_id": job.job_id,
        "restart": job.restart,
        "job_name": job.name,
        "node": job.node,
        "nodes": job.nodes,
        "step": step,
        "previous_stop": cause,
        "previous_signal": signal,
        "previous_job_id": other,
    }


def should_requeue(cfg: ClusterConfig, signal_name: str) -> bool:
    """Whether a run stopped (and checkpointed) by ``signal_name`` requeues its own job."""
    if cfg.requeue == "always":
        return True
    return cfg.requeue == "time_limit" and signal_name == cfg.time_limit_signal


def describe(record: Mapping[str, Any]) -> str:
    """A ``job`` record in words: ``SLURM job 7 restart 2 after time limit (SIGUSR1)``
    (the journal is not signed: fields of the wrong type read as unknown)."""
    scheduler = str(record.get("scheduler") or "?").upper()
    restart = record.get("restart")
    text = f"{scheduler} job {record.get('job_id')}"
    text += f" restart {restart}" if isinstance(restart, int) else ""
    cause, signal = record.get("previous_stop"), record.get("previous_signal")
    if isinstance(cause, str):
        text += f" after {cause}" + (f" ({signal})" if isinstance(signal, str) else "")
        other = record.get("previous_job_id")
        text += f" in job {other}" if isinstance(other, str) else ""
    return text
