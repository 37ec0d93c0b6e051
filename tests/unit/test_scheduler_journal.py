"""An own loop's Checkpointer in a SLURM job's environment journals each start: the job,
its restart count and how the process before stopped (killed, preempted, time limit), as
the journal recorded it; ``recovery ls`` says it. Real signals, real journal."""

from __future__ import annotations

import os
import signal

import pytest

from recovery.cli.commands.listing import history_lines, run_story
from recovery.config import CheckpointConfig, ClusterConfig
from recovery.errors import ConfigError, Preempted
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import read
from recovery.tools.report.page import requeued
from recovery.tools.report.tables import resumes_table
from tests.conftest import tiny_state, train_steps

JOB = {"SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "own", "SLURMD_NODENAME": "n1"}


def start(tmp_path, signer, trust, prov, cluster=None) -> tuple[Checkpointer, object, int]:
    ck = Checkpointer(
        CheckpointConfig(root=str(tmp_path), every_steps=2, cluster=cluster or ClusterConfig()),
        tmp_path / "run",
        final_step=6,
        signer=signer,
        trust=trust,
        provenance=prov,
        config={"seed": 0},
        health=False,
    )
    state = tiny_state()
    return ck, state, ck.restore(state, "latest")


def steps(ck: Checkpointer, state, begin: int, end: int) -> None:
    for step in range(begin + 1, end + 1):
        train_steps(state, 1)
        ck.maybe_save(state, step)


def test_each_start_in_a_job_journals_its_restart_and_the_stop_before(
    tmp_path, monkeypatch, signer, trust, prov
):
    for key, value in JOB.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    ck, state, at = start(tmp_path, signer, trust, prov)
    steps(ck, state, at, 3)  # then "killed": no close, no summary
    ck._restorer.release()
    ck.journal.close()

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    ck, state, at = start(tmp_path, signer, trust, prov)
    assert at == 2
    os.kill(os.getpid(), signal.SIGUSR1)  # the time limit's lead signal, caught
    with pytest.raises(Preempted) as stopped:
        steps(ck, state, at, 4)
    ck.close()
    assert ck.requeue_after(stopped.value) is False  # checkpoint.cluster.requeue=never

    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    ck, state, at = start(tmp_path, signer, trust, prov)
    steps(ck, state, at, 6)
    ck.close()

    jobs = [r for r in read(tmp_path / "run" / "metrics.jsonl") if r.get("event") == "job"]
    assert [(r["job_id"], r["restart"], r["step"], r["node"]) for r in jobs] == [
        ("77", 0, 0, "n1"),
        ("77", 1, 2, "n1"),
        ("77", 2, 3, "n1"),
    ]
    assert [(r["previous_stop"], r["previous_signal"]) for r in jobs] == [
        (None, None),
        ("killed (node failure or SIGKILL)", None),
        ("time limit", "SIGUSR1"),
    ]
    assert history_lines(run_story(tmp_path / "run")) == [
        "resumed at step 2 from step-00000002: not compared (nothing to compare: no step "
        "was journaled after this checkpoint); "
        "SLURM job 77 restart 1 after killed (node failure or SIGKILL)",
        "resumed at step 3 from step-00000003: not compared (nothing to compare: no step "
        "was journaled after this checkpoint); "
        "SLURM job 77 restart 2 after time limit (SIGUSR1)",
    ]
    told = run_story(tmp_path / "run")  # what recovery report shows of it
    assert requeued(told) == ", 2 requeues of SLURM job 77"
    assert [p.scheduled for p in told.processes] == [
        "SLURM job 77 restart 0",
        "SLURM job 77 restart 1 after killed (node failure or SIGKILL)",
        "SLURM job 77 restart 2 after time limit (SIGUSR1)",
    ]
    assert "SLURM job 77 restart 2 after time limit (SIGUSR1)" in resumes_table(told)


def test_outside_a_job_nothing_is_journaled_and_scheduler_slurm_refuses(
    tmp_path, monkeypatch, signer, trust, prov
):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    ck, state, at = start(tmp_path, signer, trust, prov)
    steps(ck, state, at, 2)
    ck.close()
    assert not [r for r in read(tmp_path / "run" / "metrics.jsonl") if r.get("event") == "job"]
    with pytest.raises(ConfigError, match="^checkpoint.cluster.scheduler: slurm, but"):
        start(tmp_path / "b", signer, trust, prov, ClusterConfig(scheduler="slurm"))
    assert not (tmp_path / "b").exists()  # refused before anything was touched


def test_a_second_run_in_the_same_job_is_refused_in_one_line(
    tmp_path, monkeypatch, signer, trust, prov
):
    for key, value in JOB.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    ck, state, at = start(tmp_path, signer, trust, prov)
    steps(ck, state, at, 6)
    ck.close()
    before = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    with pytest.raises(ConfigError) as refused:
        start(tmp_path, signer, trust, prov)  # the job script's next train.py
    assert str(refused.value) == (
        "run.name: SLURM job 77 (restart 0) already ran run to its end (step 6) earlier in "
        "this job; every run of a job shares the job's name, so this one would only resume "
        "that one: pass run.name=<a name of its own> to each run of a multi-run job"
    )
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == before  # nothing touched
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # a requeue of the same job: resumes
    ck, state, at = start(tmp_path, signer, trust, prov)
    assert at == 6
    ck.close()


SCONTROL = """#!/bin/sh
last=$(tail -n 1 "$RUN/metrics.jsonl" | grep -o '"event": *"[a-z_]*"')
echo "$* after $last" >> "$RUN/../scontrol-calls"
"""


def test_the_with_block_requeues_after_the_close(tmp_path, monkeypatch, signer, trust, prov):
    """scontrol (a script on PATH that records what the journal ends with when it runs)
    runs once the checkpointer is closed: its run_summary is written."""
    for key, value in JOB.items():
        monkeypatch.setenv(key, value)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("RUN", str(tmp_path / "run"))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    try:
        ck, state, at = start(tmp_path, signer, trust, prov, ClusterConfig(requeue="time_limit"))
        os.kill(os.getpid(), signal.SIGUSR1)
        with pytest.raises(SystemExit) as stop, ck:
            steps(ck, state, at, 3)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    assert stop.value.code == 75
    assert (tmp_path / "scontrol-calls").read_text().splitlines() == [
        'update JobId=77 Requeue=1 after "event":"run_summary"',
        'requeue 77 after "event":"run_summary"',
    ]
