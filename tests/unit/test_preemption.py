"""The preemption guard: signals close together are one request, a later one exits at once;
the signals it caught are handed over to the handlers it replaced (submitit's) only after
the run; the submitit base class turns a preemption into the process's exit code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from recovery.errors import Preempted
from recovery.run.scheduling import preemption
from recovery.run.scheduling.preemption import PreemptionGuard, classify
from recovery.run.scheduling.submitit import Requeueable, preemption_signal


@pytest.mark.parametrize(
    ("first_at", "now", "window", "kind"),
    [
        (None, 5.0, 2.0, "first"),
        (10.0, 10.0, 2.0, "same"),  # delivered twice at once (SLURM and a wrapper)
        (10.0, 11.9, 2.0, "same"),
        (10.0, 12.0, 2.0, "same"),  # the window's end still counts
        (10.0, 12.01, 2.0, "again"),
        (10.0, 60.0, 2.0, "again"),
        (10.0, 10.0, 0.0, "same"),  # a window of 0: only simultaneous signals are one
        (10.0, 10.1, 0.0, "again"),
    ],
)
def test_a_signal_is_a_new_request_the_same_one_or_a_second(first_at, now, window, kind):
    assert classify(first_at, now, window) == kind


@pytest.fixture
def usr2_recorder():
    """SIGUSR2 and SIGUSR1 handled by a recorder (what submitit installs before the run)."""
    calls: list[int] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    for s in before:
        signal.signal(s, lambda signum, frame: calls.append(signum))
    yield calls
    for s, handler in before.items():
        signal.signal(s, handler)


def test_signals_within_the_window_are_one_request(usr2_recorder):
    now = [100.0]
    guard = PreemptionGuard(["SIGUSR1", "SIGUSR2"], window_s=1.0, clock=lambda: now[0])
    guard.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        now[0] += 0.9
        os.kill(os.getpid(), signal.SIGUSR2)  # within the window: no exit
    finally:
        guard.uninstall()
    assert guard.requested == "SIGUSR1"
    assert guard.received == [signal.SIGUSR1, signal.SIGUSR2]
    assert usr2_recorder == []  # nothing handed over outside handing_over()


def test_the_caught_signals_go_to_the_replaced_handlers_after_the_run(usr2_recorder):
    guard = PreemptionGuard(["SIGUSR2", "SIGUSR1"])
    with preemption.handing_over():
        guard.install()
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR2)  # a copy: the same request
        assert usr2_recorder == []  # not while the run goes on
        guard.uninstall()
        assert usr2_recorder == []  # not while it closes
    assert usr2_recorder == [signal.SIGUSR2, signal.SIGUSR1]  # arrival order, each once
    assert signal.getsignal(signal.SIGUSR2) is not guard._handle


def test_nothing_is_handed_over_without_a_signal_or_to_a_default_handler(usr2_recorder):
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        quiet = PreemptionGuard(["SIGUSR2"])
        with preemption.handing_over():
            quiet.install().uninstall()
        termed = PreemptionGuard(["SIGTERM"])
        with preemption.handing_over():
            termed.install()
            os.kill(os.getpid(), signal.SIGTERM)
            termed.uninstall()
        assert termed.requested == "SIGTERM"
    finally:
        signal.signal(signal.SIGTERM, before)
    assert usr2_recorder == []


def test_python_s_own_sigint_handler_is_not_handed_over():
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        guard = PreemptionGuard(["SIGINT"])
        with preemption.handing_over():  # no KeyboardInterrupt out of it
            guard.install()
            os.kill(os.getpid(), signal.SIGINT)
            guard.uninstall()
    finally:
        signal.signal(signal.SIGINT, before)
    assert guard.requested == "SIGINT"


def test_what_the_replaced_handler_raises_leaves_the_block(usr2_recorder):
    def requeue(signum, frame):  # submitit's: checkpoint(), scontrol requeue, sys.exit(-1)
        raise SystemExit(-1)

    signal.signal(signal.SIGUSR2, requeue)
    guard = PreemptionGuard(["SIGUSR2"])
    with pytest.raises(SystemExit) as stop, preemption.handing_over():
        guard.install()
        os.kill(os.getpid(), signal.SIGUSR2)
        guard.uninstall()
        raise SystemExit(75)  # the preempted run's own exit
    assert stop.value.code == -1


GUARDED = """
import os, signal, sys, time
from recovery.run.scheduling.preemption import PreemptionGuard
guard = PreemptionGuard(["SIGTERM", "SIGUSR1"], window_s={window}).install()
for sig, pause in {plan}:
    os.kill(os.getpid(), sig)
    time.sleep(pause)
print("requested", guard.requested, [s.name for s in guard.received], flush=True)
"""


@pytest.mark.parametrize(
    ("plan", "code"),
    [
        # a forwarded copy 0.1 s after SLURM's: one request, the run goes on to checkpoint
        ([(signal.SIGTERM, 0.1), (signal.SIGUSR1, 0.0)], 0),
        # a second signal after the window: exits at once, 128 + its number
        ([(signal.SIGTERM, 0.6), (signal.SIGUSR1, 0.0)], 128 + signal.SIGUSR1),
    ],
)
def test_real_signals_to_a_process(plan, code):
    script = GUARDED.format(window=0.4, plan=[(int(s), p) for s, p in plan])
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code, done.stderr
    if code:
        assert "second preemption signal (SIGUSR1)" in done.stderr
        assert "requested" not in done.stdout
    else:
        assert done.stdout == "requested SIGTERM ['SIGTERM', 'SIGUSR1']\n"


JOINED = """
import logging, os, signal, time
logging.basicConfig(level=logging.INFO)
from recovery.run.scheduling.preemption import PreemptionGuard
guard = PreemptionGuard(["SIGUSR1"], window_s=0.5).install()
guard.join("SIGUSR1")  # another rank's signal, agreed on: this one's comes later
guard.uninstall()
os.kill(os.getpid(), signal.SIGUSR1)  # its own copy, after the run closed
print("survived", [s.name for s in guard.received], flush=True)
time.sleep(0.6)
again = PreemptionGuard(["SIGUSR1"], window_s=0.5).install()  # the next run's guard
again.join("SIGUSR1")
again.uninstall()
os.kill(os.getpid(), signal.SIGUSR1)  # the first's window is over, not this one's
print("survived again", flush=True)
time.sleep(0.6)
os.kill(os.getpid(), signal.SIGUSR1)  # past the window: the default's action
print("not reached", flush=True)
"""


def test_a_copy_after_the_agreed_stop_and_the_close_is_the_same_request():
    done = subprocess.run(
        [sys.executable, "-c", JOINED], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGUSR1, done.stderr
    assert done.stdout == "survived ['SIGUSR1']\nsurvived again\n"
    assert "SIGUSR1 after the run closed: the same preemption" in done.stderr


@pytest.mark.parametrize(
    ("names", "time_limit", "expected"),
    [
        (["", "SIGUSR1"], "SIGUSR1", "SIGUSR1"),  # only rank 1 got it: rank 0 follows
        (["SIGTERM", "SIGUSR1"], "SIGUSR1", "SIGUSR1"),  # the time limit's decides
        (["", "SIGTERM", "SIGHUP"], "SIGUSR1", "SIGTERM"),  # else the lowest rank's
        (["SIGUSR1", ""], None, "SIGUSR1"),
        (["", ""], "SIGUSR1", None),
    ],
)
def test_the_signal_the_ranks_agree_on(names, time_limit, expected):
    assert preemption.agreed(names, time_limit) == expected


class Job(Requeueable):
    def run(self, steps: int, *, resume: str) -> int:
        if steps > 10:
            raise Preempted("stopped", step=10, signal_name="SIGUSR2", exit_status=143)
        return steps


def test_a_requeueable_job_resubmits_the_same_call_and_exits_preempted_with_its_code():
    from submitit.helpers import DelayedSubmission

    job = Job()
    assert job(5, resume="latest") == 5
    with pytest.raises(SystemExit) as stop:
        job(20, resume="latest")
    assert stop.value.code == 143
    again = job.checkpoint(20, resume="latest")
    assert isinstance(again, DelayedSubmission)
    assert (again.function, again.args, again.kwargs) == (job, (20,), {"resume": "latest"})


def test_the_signal_a_submitit_run_catches(monkeypatch):
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    assert preemption_signal() == "SIGUSR2"
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    assert preemption_signal() == "SIGUSR1"
