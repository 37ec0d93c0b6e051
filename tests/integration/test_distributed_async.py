"""torchrun jobs with ``checkpoint.async=true``: each rank's pause is a copy, the background
saves equal the synchronous ones, and a rank killed mid-save commits nothing."""

from __future__ import annotations

import re
import signal
import statistics

import pytest

from recovery.format.layout import METRICS_FILE, scan
from recovery.run.journal import read
from tests.integration.test_distributed import assert_same_job

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_async_saves_under_torchrun_end_bit_identical_to_sync_saves(
    strategy, job, trainer, tmp_path, trust
):
    reference = job(strategy, 2)
    root = tmp_path / "async"
    done = trainer(root, f"dist.strategy={strategy}", "checkpoint.async=true", nproc=2)
    assert done.returncode == 0, done.output
    assert_same_job(reference, root / "r", trust, ranks=2)
    saves = [r for r in read(root / "r" / METRICS_FILE) if r.get("event") == "checkpoint"]
    assert [r["step"] for r in saves] == list(range(10, 81, 10))
    assert {r["mode"] for r in saves} == {"async"}
    assert {r["max_loss_intervals"] for r in saves} == {2}
    assert all(r["pause_s"] > 0 and r["write_s"] > 0 for r in saves)
    # the training thread is held for the copy only, not for the write behind it
    pause = statistics.median(r["pause_s"] for r in saves)
    assert pause < statistics.median(r["write_s"] for r in saves)


@pytest.mark.parametrize(
    ("strategy", "point", "tier"),
    [
        ("ddp", "rank-1-sharded-30", False),
        ("fsdp", "rank-0-write-30", False),
        ("fsdp", "rank-1-sharded-30", True),
    ],
    ids=["ddp-sharded", "fsdp-write", "fsdp-promotion"],
)
def test_a_rank_killed_during_its_background_save_commits_nothing_and_the_job_resumes(
    strategy, point, tier, job, trainer, tmp_path, trust
):
    """The fault point is reached on the rank's background thread, while training goes
    on; SIGKILL that rank there: step 30 is never committed (rank 0 renames only after
    every rank agreed), and ``+resume=latest`` continues exactly from step 20. With the
    local tier (``tier``) that thread is the promotion of step 30 from the ranks' snapshots
    (the save itself synchronous): the job resumes from a snapshot at least as new."""
    reference = job(strategy, 2)
    root = tmp_path / "job"
    local = ("checkpoint.local.every_steps=5", f"checkpoint.local.root={tmp_path / 'ram'}")
    run = (f"dist.strategy={strategy}", *(local if tier else ["checkpoint.async=true"]))
    killed = trainer(root, *run, nproc=2, pause_at=point, kill_marked_rank=True, timeout=240)
    assert killed.returncode != 0
    listing = scan(root / "r")
    assert [s for s, _ in listing.committed] == [10, 20]
    assert listing.stale, "the abandoned write stays as an unsigned temp directory"
    resumed = trainer(root, *run, "+resume=latest", nproc=2)
    assert resumed.returncode == 0, resumed.output
    [back] = [r for r in read(root / "r" / METRICS_FILE) if r.get("event") == "resume"]
    if tier:
        assert back["tier"] == "local" and back["step"] >= 30, back
    else:
        assert "RESUMED run" in resumed.output and "step-00000020" in resumed.output
    assert "removing" in resumed.output and "never committed" in resumed.output
    assert not scan(root / "r").stale
    assert_same_job(reference, root / "r", trust, ranks=2)
    if tier:  # every persistent save but the one killed was promoted
        modes = {r["mode"] for r in read(root / "r" / METRICS_FILE) if r.get("mode")}
        assert modes == {"promoted"}


def test_sigterm_during_a_background_save_waits_for_it_then_checkpoints_every_rank(
    job, trainer, tmp_path, trust
):
    """SIGTERM reaches the ranks while rank 1's background save of step 20 is held at a
    fault point: the ranks agree on a step, wait for step 20 to commit, save that step
    synchronously, exit 75 each; the requeued job ends bit-identical."""
    reference = job("ddp", 2)
    root = tmp_path / "preempted"
    run = ("dist.strategy=ddp", "checkpoint.async=true")
    stopped = trainer(root, *run, nproc=2, pause_at="rank-1-sharded-20", signals=(signal.SIGTERM,))
    assert stopped.returncode != 0
    [at] = {
        int(s) for s in re.findall(r"preempted: SIGTERM: checkpointed step (\d+)", stopped.output)
    }
    assert stopped.output.count(f"preempted: SIGTERM: checkpointed step {at}") == 2  # both ranks
    listing = scan(root / "r")
    # the ranks train on while rank 1's save is held, so the signal, passed on by the
    # agent, may reach them only while step 30's save waits for step 20's: then step 30
    # is saved as usual first (and retention keeps the newest three)
    committed = [s for s, _ in listing.committed]
    assert committed == ([10, 20, at] if at <= 30 else [20, 30, at]) and not listing.stale
    modes = {r["step"]: r["mode"] for r in read(root / "r" / METRICS_FILE) if "mode" in r}
    usual = {10: "async", 20: "async"} | ({30: "async"} if at > 30 else {})
    assert modes == usual | {at: "sync"}
    resumed = trainer(root, *run, "+resume=latest", nproc=2)
    assert resumed.returncode == 0, resumed.output
    assert_same_job(reference, root / "r", trust, ranks=2)
