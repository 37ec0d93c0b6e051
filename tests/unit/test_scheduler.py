"""The scheduler a run is under (recovery.run.scheduling.slurm): a SLURM job from its environment,
the run's name, how the run before a start stopped, when a run requeues its own job, and
checkpoint.cluster's validation."""

from __future__ import annotations

import pytest

from recovery.config import CheckpointConfig, ClusterConfig
from recovery.errors import ConfigError
from recovery.run.scheduling import slurm
from recovery.run.scheduling.slurm import ENDED, KILLED, PREEMPTED, TIME_LIMIT, Job

JOB = {"SLURM_JOB_ID": "41", "SLURM_JOB_NAME": "train", "SLURM_JOB_NODELIST": "n[1-2]"}


@pytest.mark.parametrize(
    ("env", "setting", "job_id", "own", "restart", "name", "node"),
    [
        (JOB, "auto", "41", "41", 0, "slurm-41", "n[1-2]"),  # first run: no restart count
        (JOB | {"SLURM_RESTART_COUNT": "3"}, "auto", "41", "41", 3, "slurm-41", "n[1-2]"),
        (JOB | {"SLURMD_NODENAME": "n2"}, "slurm", "41", "41", 0, "slurm-41", "n2"),
        # an array task has a job id of its own; the run is named by array id and task
        (
            JOB | {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "7"},
            "auto",
            "40_7",
            "41",
            0,
            "slurm-40-7",
            "n[1-2]",
        ),
        ({"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "x"}, "auto", "9", "9", 0, "slurm-9", None),
        ({"SLURM_JOB_ID": "9", "SLURM_NODELIST": "a"}, "auto", "9", "9", 0, "slurm-9", "a"),
    ],
)
def test_a_slurm_job_from_its_environment(env, setting, job_id, own, restart, name, node):
    job = slurm.detect(env, setting)
    assert job is not None
    assert (job.job_id, job.own_id, job.restart, job.run_name, job.node) == (
        job_id,
        own,
        restart,
        name,
        node,
    )


@pytest.mark.parametrize(
    ("env", "setting"),
    [({}, "auto"), (JOB, "none"), ({"SLURM_JOB_ID": " "}, "auto"), ({}, "none")],
)
def test_no_job_outside_slurm_or_when_told_to_ignore_it(env, setting):
    assert slurm.detect(env, setting) is None


def test_scheduler_slurm_outside_a_job_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"^checkpoint.cluster.scheduler: slurm, but .*=auto$"):
        slurm.detect({}, "slurm")


@pytest.mark.parametrize(
    ("configured", "in_job", "explicit", "expected"),
    [
        ("default", True, False, "slurm-41"),
        ("mine", True, True, "mine"),  # an explicit run.name wins
        ("default", True, True, "default"),  # run.name=default on the command line too
        ("default", False, False, "default"),
    ],
)
def test_the_run_name(configured, in_job, explicit, expected):
    job = slurm.detect(JOB) if in_job else None
    assert slurm.run_name(configured, job, explicit=explicit) == expected


START = {"event": "start", "run_id": "r"}
RESUME = {"event": "resume", "run_id": "r", "step": 20}
STEP = {"step": 21, "loss": 1.0}
SUMMARY = {"event": "run_summary", "run_s": 1.0}


def preempted(signal: str) -> dict:
    return {"event": "preempted", "signal": signal, "step": 21}


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([], None),  # a first start
        ([STEP], None),  # no begin event: nothing says a process ran
        ([START, STEP, preempted("SIGTERM"), SUMMARY], (PREEMPTED, "SIGTERM")),
        ([START, STEP, preempted("SIGUSR1"), SUMMARY], (TIME_LIMIT, "SIGUSR1")),
        ([START, STEP], (KILLED, None)),  # nothing after a SIGKILL
        ([START, STEP, SUMMARY], (ENDED, None)),
        # only the last process counts: its preemption, not an earlier one
        ([START, preempted("SIGUSR1"), SUMMARY, RESUME, STEP], (KILLED, None)),
        ([START, STEP, SUMMARY, RESUME, preempted("SIGTERM")], (PREEMPTED, "SIGTERM")),
        ([START, preempted("a peer rank's preemption")], (PREEMPTED, "a peer rank's preemption")),
    ],
)
def test_how_the_run_before_stopped(records, expected):
    assert slurm.previous_stop(records, "SIGUSR1") == expected


def test_without_a_time_limit_signal_every_preemption_is_one():
    records = [START, preempted("SIGUSR1")]
    assert slurm.previous_stop(records, None) == (PREEMPTED, "SIGUSR1")


def test_the_job_event_and_its_words():
    job = slurm.detect(JOB | {"SLURM_RESTART_COUNT": "2", "SLURMD_NODENAME": "n1"})
    assert isinstance(job, Job)
    record = slurm.event(job, (TIME_LIMIT, "SIGUSR1"), 51)
    assert record == {
        "event": "job",
        "scheduler": "slurm",
        "job_id": "41",
        "restart": 2,
        "job_name": "train",
        "node": "n1",
        "nodes": "n[1-2]",
        "step": 51,
        "previous_stop": "time limit",
        "previous_signal": "SIGUSR1",
        "previous_job_id": None,
    }
    assert slurm.describe(record) == "SLURM job 41 restart 2 after time limit (SIGUSR1)"
    assert slurm.event(job, (TIME_LIMIT, "SIGUSR1"), 51, "41")["previous_job_id"] is None
    first = slurm.event(job, None, 0)
    assert first["previous_stop"] is None
    assert slurm.describe(first) == "SLURM job 41 restart 2"
    # the journal is not signed: a field of the wrong type reads as unknown, never fails
    assert slurm.describe({"restart": "2", "previous_stop": 3}) == "? job None"


def test_a_run_continued_in_another_job_is_not_called_requeued():
    job = slurm.detect({"SLURM_JOB_ID": "41"})
    assert isinstance(job, Job)
    record = slurm.event(job, (PREEMPTED, "SIGTERM"), 30, "40")
    assert (record["previous_stop"], record["previous_job_id"]) == ("preempted", "40")
    assert slurm.describe(record) == "SLURM job 41 restart 0 after preempted (SIGTERM) in job 40"
    limit = slurm.event(job, (TIME_LIMIT, "SIGUSR1"), 30, "40")
    assert slurm.describe(limit) == "SLURM job 41 restart 0 after time limit (SIGUSR1) in job 40"
    records = [START, job_record("40", 0), STEP, preempted("SIGTERM")]
    assert slurm.previous_job(records) == job_record("40", 0)
    assert slurm.previous_job([job_record("40", 0), START, STEP]) is None


def job_record(job_id: str, restart: int) -> dict:
    return {"event": "job", "job_id": job_id, "restart": restart}


def saved(step: int) -> dict:
    return {"event": "checkpoint", "step": step}


@pytest.mark.parametrize(
    ("records", "restart", "expected"),
    [
        # a second train.py of one job script: the first ran to its end in this instance
        ([START, job_record("41", 0), saved(30), SUMMARY], 0, 30),
        ([START, job_record("41", 0), saved(40), SUMMARY], 0, 40),  # a longer first run
        ([], 0, None),  # a first start
        ([START, job_record("41", 0), saved(30), SUMMARY], 1, None),  # a requeue
        ([START, job_record("40", 0), saved(30), SUMMARY], 0, None),  # another job
        ([START, saved(30), SUMMARY], 0, None),  # journaled outside a job
        # a restart inside the allocation (torchrun's agent) after a kill, a crash or a stop
        ([START, job_record("41", 0), saved(30)], 0, None),
        ([START, job_record("41", 0), saved(20), SUMMARY], 0, None),
        ([START, job_record("41", 0), saved(30), preempted("SIGTERM"), SUMMARY], 0, None),
    ],
)
def test_a_second_run_in_the_same_job_instance(records, restart, expected):
    job = slurm.detect({"SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": str(restart)})
    assert isinstance(job, Job)
    assert slurm.ran_to_end(records, job, 30) == expected


@pytest.mark.parametrize(
    ("requeue", "signal", "expected"),
    [
        ("never", "SIGUSR1", False),
        ("time_limit", "SIGUSR1", True),
        ("time_limit", "SIGTERM", False),  # SLURM requeues a preempted --requeue job itself
        ("time_limit", "a peer rank's preemption", False),
        ("always", "SIGTERM", True),
    ],
)
def test_when_a_run_requeues_its_own_job(requeue, signal, expected):
    assert slurm.should_requeue(ClusterConfig(requeue=requeue), signal) is expected


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"scheduler": "pbs"}, "checkpoint.cluster.scheduler"),
        ({"requeue": "yes"}, "checkpoint.cluster.requeue"),
        ({"time_limit_signal": "SIGKILL"}, "checkpoint.cluster.time_limit_signal"),
        (
            {"time_limit_signal": None, "requeue": "time_limit"},
            "checkpoint.cluster.time_limit_signal",
        ),
        ({"scheduler": "none", "requeue": "always"}, "checkpoint.cluster.requeue"),
    ],
)
def test_bad_cluster_settings_are_one_line_naming_the_key(kwargs, key):
    with pytest.raises(ConfigError) as refused:
        ClusterConfig(**kwargs)
    line = str(refused.value)
    assert line.startswith(f"{key}: ") and "\n" not in line and "; set e.g. " in line


def test_requeue_on_the_time_limit_needs_its_signal_caught():
    cluster = ClusterConfig(requeue="time_limit", time_limit_signal="SIGUSR2")
    with pytest.raises(ConfigError, match=r"^checkpoint.preempt_signals: .*SIGUSR2\]$"):
        CheckpointConfig(cluster=cluster)
    assert CheckpointConfig(cluster=cluster, preempt_signals=["SIGTERM", "SIGUSR2"])
    # not requeueing: an uncaught time-limit signal only names no stop "time limit"
    assert CheckpointConfig(preempt_signals=["SIGTERM"])
