"""A preempted run requeues its own SLURM job (``checkpoint.cluster.requeue``).

SLURM requeues a preempted job submitted with ``--requeue`` by itself, but never a
job that reached its time limit: a run stopped by the time limit's lead signal
(``sbatch --signal=USR1@120``) asks for it, after its checkpoint is committed and its
journal closed. ``scontrol requeue`` from inside the job sends SIGTERM to every process
of the job, this one included, so from here on the process ignores the signals that
would end it, and it then exits ``checkpoint.preempt_exit_code`` as any preempted run.
A job submitted with ``--no-requeue`` refuses ``scontrol requeue`` ("Requested
operation is presently disabled") until ``scontrol update JobId=J Requeue=1``, which
comes first. The requeued job is eligible again ``cred_expire + 1`` seconds later (121
by default).

A requeue that fails is logged in one line, never raised: the checkpoint is
committed, and the exit code still says "requeue me" to whatever watches the job.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence

from recovery.run.scheduling.slurm import Job

log = logging.getLogger(__name__)

IGNORED = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP")
"""Ignored from the requeue on: what SLURM (and ``srun``, passing them on) sends the job."""

Run = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


def _scontrol(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["scontrol", *args], text=True, capture_output=True, timeout=30, check=False
    )


def _one_line(text: str | None) -> str:
    """scontrol's stderr (several lines when it cannot reach the controller) in one line."""
    return " ".join((text or "").split()) or "(no message)"


def ignore_signals(extra: Sequence[str] = ()) -> None:
    """Ignore :data:`IGNORED` and ``extra`` for the rest of the process (main thread only:
    elsewhere a warning, and the requeue's SIGTERM may end the process as 143)."""
    if threading.current_thread() is not threading.main_thread():
        log.warning("requeue: not on the main thread; its SIGTERM may end this process")
        return
    for name in {*IGNORED, *extra}:
        sig = getattr(signal, name, None)
        if isinstance(sig, signal.Signals) and sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_IGN)


def requeue(job: Job, *, also_ignore: Sequence[str] = (), run: Run = _scontrol) -> bool:
    """Requeue ``job`` (``scontrol update JobId=J Requeue=1``, then ``scontrol requeue
    J``), ignoring the signals that follow; ``True`` when SLURM accepted it. Call it
    once per job (rank 0), after the checkpoint is committed and the journal closed."""
    ignore_signals(also_ignore)
    try:  # the update is not needed by a job submitted requeueable: its failure or
        # time-out (a busy controller) is said, and the requeue is tried all the same
        update = run(["update", f"JobId={job.own_id}", "Requeue=1"])
        if update.returncode:
            log.info("requeue: scontrol update Requeue=1: %s", _one_line(update.stderr))
    except (OSError, subprocess.SubprocessError) as err:
        log.info("requeue: scontrol update Requeue=1 for %s: %s", job.describe, err)
    try:
        done = run(["requeue", job.own_id])
    except (OSError, subprocess.SubprocessError) as err:
        log.error("requeue: could not run scontrol for %s: %s", job.describe, err)
        return False
    if done.returncode:
        log.error(
            "requeue: scontrol requeue %s exited %d: %s; requeue it by hand",
            job.own_id,
            done.returncode,
            _one_line(done.stderr),
        )
        return False
    log.warning("requeued %s: it runs again (+resume=latest) once SLURM starts it", job.describe)
    return True
