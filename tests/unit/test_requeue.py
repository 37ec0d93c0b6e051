"""A run requeueing its own SLURM job (recovery.run.scheduling.requeue) when scontrol fails: it
returns False, never raises, and logs one line; what real scontrol calls there are runs
through the injectable ``run=`` (tests/integration/test_slurm.py runs the real one)."""

from __future__ import annotations

import logging
import signal
import subprocess
from collections.abc import Sequence

import pytest

from recovery.run.scheduling import requeue, slurm

JOB = slurm.detect({"SLURM_JOB_ID": "5"})
STDERR = "scontrol: error: _establish_config_source: failed\nslurm_load_ctl_conf error\n\n"


@pytest.fixture(autouse=True)
def handlers():
    """requeue() ignores the job's signals for the rest of the process: restored after."""
    sigs = [signal.Signals[n] for n in requeue.IGNORED]
    before = {s: signal.getsignal(s) for s in sigs}
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


def refused(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["scontrol", *args], 1, "", STDERR)


def missing(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/nonexistent/scontrol", *args], text=True, check=False)


def slow(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sleep", "5"], timeout=0.05, text=True, check=False)


@pytest.mark.parametrize(
    ("run", "message"),
    [
        (missing, "requeue: could not run scontrol for SLURM job 5 (restart 0): "),
        (slow, "requeue: could not run scontrol for SLURM job 5 (restart 0): Command"),
        (refused, "requeue: scontrol requeue 5 exited 1: scontrol: error: "),
    ],
)
def test_a_failed_requeue_returns_false_in_one_line_and_ignores_the_job_s_signals(
    run, message, caplog
):
    caplog.set_level(logging.INFO, logger="recovery.run.scheduling.requeue")
    assert requeue.requeue(JOB, run=run) is False
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith(message), errors
    assert all("\n" not in r.getMessage() for r in caplog.records)
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN


def test_an_update_refused_is_one_info_line_and_the_requeue_still_runs(caplog):
    caplog.set_level(logging.INFO, logger="recovery.run.scheduling.requeue")
    outcomes = iter([1, 0])
    calls: list[list[str]] = []

    def run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(args))
        return subprocess.CompletedProcess(args, next(outcomes), "", STDERR)

    assert requeue.requeue(JOB, run=run) is True
    assert calls == [["update", "JobId=5", "Requeue=1"], ["requeue", "5"]]
    assert caplog.records[0].getMessage() == (
        "requeue: scontrol update Requeue=1: scontrol: error: _establish_config_source: "
        "failed slurm_load_ctl_conf error"
    )


def test_an_update_that_timed_out_is_one_info_line_and_the_requeue_still_runs(caplog):
    caplog.set_level(logging.INFO, logger="recovery.run.scheduling.requeue")
    calls: list[list[str]] = []

    def run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(args))
        if args[0] == "update":  # a busy controller: scontrol's own 30 s ran out
            raise subprocess.TimeoutExpired(["scontrol", *args], 30)
        return subprocess.CompletedProcess(args, 0, "", "")

    assert requeue.requeue(JOB, run=run) is True
    assert calls == [["update", "JobId=5", "Requeue=1"], ["requeue", "5"]]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos[0].startswith("requeue: scontrol update Requeue=1 for SLURM job 5 (restart 0): ")
    assert "timed out after 30 seconds" in infos[0]
