"""A Requeueable job under submitit's real signal handlers, in this process (SLURM's
side: tests/integration/test_submitit.py): submitit's preemption signal is caught by the
run's guard, and submitit's handler runs only after the run stopped, calling
``checkpoint()`` and requeueing; a SIGTERM alone ends the process with the preemption's
code, nothing requeued by submitit (SLURM requeues a preempted job itself)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from submitit.core.job_environment import JobEnvironment
from submitit.core.utils import DelayedSubmission, JobPaths

from recovery.errors import Preempted
from recovery.run.scheduling.preemption import PreemptionGuard
from recovery.run.scheduling.submitit import Requeueable, preemption_signal


class Env(JobEnvironment):
    """submitit's job environment with ``scontrol requeue`` recorded instead of run."""

    _env = {"job_id": "RECOVERY_TEST_JOB_ID", "global_rank": "RECOVERY_TEST_RANK"}  # unset: 0

    def __init__(self) -> None:
        super().__init__()
        self.requeued: list[int] = []

    def _requeue(self, countdown: int) -> None:
        self.requeued.append(countdown)


class Job(Requeueable):
    """A run that is signalled in the middle of a step and stops at the boundary."""

    def run(self, signum: int, events: list[str]) -> None:
        guard = PreemptionGuard([preemption_signal(), "SIGTERM"]).install()
        try:
            os.kill(os.getpid(), signum)  # mid-step: only the guard's flag is set
            events.append("step boundary")
            assert guard.requested is not None
            raise Preempted("checkpointed", step=3, signal_name=guard.requested)
        finally:
            guard.uninstall()
            events.append("closed")

    def checkpoint(self, *args, **kwargs):  # what submitit's handler calls
        args[1].append("checkpoint()")
        return super().checkpoint(*args, **kwargs)


class Unclosed(Job):
    """A loop without the with-block: its Preempted leaves run() with the guard installed."""

    def run(self, signum: int, events: list[str]) -> None:
        guard = PreemptionGuard([preemption_signal(), "SIGTERM"]).install()
        os.kill(os.getpid(), signum)
        events.append("step boundary")
        raise Preempted("checkpointed", step=3, signal_name=str(guard.requested))


@pytest.fixture
def submitit_handlers(tmp_path, monkeypatch):
    """submitit's handlers installed as its job process installs them; restored after."""
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    monkeypatch.setenv("RECOVERY_TEST_JOB_ID", "41")
    sigs = (signal.SIGTERM, signal.SIGCONT, signal.SIGUSR2)
    before = {s: signal.getsignal(s) for s in sigs}

    def install(delayed: DelayedSubmission) -> tuple[Env, JobPaths]:
        env, paths = Env(), JobPaths(tmp_path, job_id="41", task_id=0)
        env._handle_signals(paths, delayed)
        return env, paths

    yield install
    for s, handler in before.items():
        signal.signal(s, handler)


def preempted(
    signum: int, install, job: Job | None = None
) -> tuple[object, list[str], Env, JobPaths]:
    """Run a Job under submitit's handlers, signalled by ``signum`` mid-step: its exit
    code, the order of events, submitit's environment and paths."""
    events: list[str] = []
    delayed = DelayedSubmission(job or Job(), int(signum), events)
    delayed.set_timeout(60, 3)  # 60 minutes, 3 timeouts: as submitit's executor sets it
    env, paths = install(delayed)
    with pytest.raises(SystemExit) as stop:
        delayed.result()
    return stop.value.code, events, env, paths


def test_submitits_signal_requeues_after_the_run_stopped(submitit_handlers):
    code, events, env, paths = preempted(signal.SIGUSR2, submitit_handlers)
    assert code == -1  # submitit's own exit after its requeue
    assert events == ["step boundary", "closed", "checkpoint()"]
    assert env.requeued == [3]  # not timed out: the countdown is untouched
    again = DelayedSubmission.load(paths.submitted_pickle)  # what the requeued job runs
    assert isinstance(again.function, Job) and again.args[0] == signal.SIGUSR2


def test_a_sigterm_alone_exits_with_the_preemption_code_and_submitit_requeues_nothing(
    submitit_handlers,
):
    code, events, env, paths = preempted(signal.SIGTERM, submitit_handlers)
    assert code == 75
    assert events == ["step boundary", "closed"]  # submitit's handler only logged it
    assert env.requeued == [] and not Path(paths.submitted_pickle).exists()


def test_a_run_that_does_not_close_its_guard_is_still_handed_over_and_requeued(
    submitit_handlers,
):
    code, events, env, _ = preempted(signal.SIGUSR2, submitit_handlers, Unclosed())
    assert code == -1
    assert events == ["step boundary", "checkpoint()"]
    assert env.requeued == [3]
    assert signal.getsignal(signal.SIGUSR2) is not None  # the guard is gone
