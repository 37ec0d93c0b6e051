"""train.py under a real SLURM (tests/integration/slurm_cluster.py), submitted with the
sbatch script users copy (examples/slurm/train.sbatch): a job requeued mid-run, by SLURM
and by itself at a real time limit, comes back and finishes bit-identical to an
uninterrupted run, and its journal names each restart and its cause; the tasks of a job
array keep separate runs, each named after its task."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery import faults
from recovery.cli.commands.listing import history_lines, run_story
from recovery.format.layout import METRICS_FILE, scan
from recovery.integrity.keys.trust import KEY_ENV
from recovery.run.journal import read
from tests.integration.conftest import ROOT, SMALL, assert_same_run
from tests.integration.slurm_cluster import SlurmCluster, live, running

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "examples" / "slurm" / "train.sbatch"
# the run names itself after the job; every other SMALL setting is passed through
OVERRIDES = [o for o in SMALL if not o.startswith("run.name=")]
LEAD = 120
"""``--signal=USR1@120``, as the script's own: under a 2-minute limit slurmctld sends it
at its next check of the limits (a 30 s tick; it sends the lead up to one tick early)."""


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """One private SLURM for the session (each xdist worker that needs it starts its own)."""
    with running() as cluster:
        yield cluster


def submit(
    cluster: SlurmCluster,
    where: Path,
    data_root: Path,
    signer,
    *overrides: str,
    env_extra: dict[str, str] | None = None,
    **opts,
) -> str:
    """examples/slurm/train.sbatch on SMALL (plus ``overrides``), run from the project root
    by this venv's python with this checkout on PYTHONPATH, its runs under ``where``; the
    job gets this environment (sbatch exports it) with ``env_extra``."""
    env = {"PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env |= {KEY_ENV: str(signer.path), **(env_extra or {})}
    return cluster.sbatch(
        SCRIPT,
        f"checkpoint.root={where}",
        f"recipe.data.root={data_root}",
        *OVERRIDES,
        *overrides,
        env=env,
        chdir=ROOT,
        **opts,
    )


def wait_for(
    path: Path, text: str | None, cluster: SlurmCluster, job: str, timeout: float = 60
) -> None:
    """Until ``path`` exists (and holds ``text``), failing at once if ``job`` ended."""
    end = time.monotonic() + timeout
    while not (path.exists() and (text is None or text in path.read_text())):
        state = cluster.state(job)
        assert live(state), f"job {job} {state}"
        assert time.monotonic() < end, f"no {text or path} after {timeout} s"
        time.sleep(0.05)


def test_a_job_requeued_by_slurm_and_at_its_time_limit_comes_back_bit_identical(
    tmp_path, slurm, reference, data_root, signer, trust
):
    """Requeued twice: by ``scontrol requeue`` (SLURM's SIGTERM to every process), then at
    a real time limit: the script's ``--signal=USR1@<lead>``, which slurmctld sends when
    the limit comes near; the run checkpoints, requeues its own job and the third run
    finishes. The job has 10 minutes; the second run, once paused after step 50 (its
    handlers installed), gets a 2-minute limit (``scontrol update``), so slurmctld's
    signal comes at its next check (within 30 s) and not during a slow start-up; the
    third gets its 10 minutes back while pending."""
    out = tmp_path / "job.out"
    mark, release = tmp_path / "paused.mark", tmp_path / "release"
    # paused after steps 20 and 50 (their checkpoints committed): the kills land mid-run
    pause = {faults.PAUSE_ENV: "step-20,step-50", faults.MARK_ENV: str(mark)}
    pause[faults.RELEASE_ENV] = str(release)
    opts = {"output": out, "time": 10, "signal": f"USR1@{LEAD}"}
    job = submit(slurm, tmp_path, data_root, signer, env_extra=pause, **opts)
    wait_for(mark, None, slurm, job)
    slurm.requeue(job)
    wait_for(out, "SIGTERM received", slurm, job)  # caught while paused at step 20
    release.touch()
    slurm.wait(job, ("PENDING",))
    mark.unlink()
    release.unlink()
    slurm.start_now(job)
    wait_for(mark, None, slurm, job)  # the second run, paused at step 50
    slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=2")
    wait_for(out, "SIGUSR1 received", slurm, job, timeout=60)  # from slurmctld
    release.touch()
    slurm.wait(job, ("PENDING",))  # requeued by train.py itself
    slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=10")
    slurm.start_now(job)
    assert slurm.wait(job) == "COMPLETED", out.read_text()
    log = out.read_text()
    assert f"run named slurm-{job} after the job" in log
    assert f"requeued SLURM job {job} (restart 1)" in log
    assert slurm.show(job)["Restarts"] == "2"
    run_dir = tmp_path / f"slurm-{job}"  # the same run directory every time
    journal = read(run_dir / METRICS_FILE)
    preempted = [(r["signal"], r["step"]) for r in journal if r.get("event") == "preempted"]
    assert preempted == [("SIGTERM", 21), ("SIGUSR1", 51)]
    assert [r["step"] for r in journal if r.get("event") == "resume"] == [21, 51]
    jobs = [r for r in journal if r.get("event") == "job"]
    assert [(r["job_id"], r["restart"], r["step"]) for r in jobs] == [
        (job, 0, 0),
        (job, 1, 21),
        (job, 2, 51),
    ]
    assert [r["previous_stop"] for r in jobs] == [None, "preempted/requeued", "time limit"]
    assert history_lines(run_story(run_dir))[-1].endswith(
        f"SLURM job {job} restart 2 after time limit (SIGUSR1)"
    )
    assert_same_run(reference, run_dir, trust)


def test_the_tasks_of_a_job_array_keep_separate_runs(tmp_path, slurm, data_root, signer):
    steps = [o for o in OVERRIDES if not o.startswith("train.steps=")]
    array = submit(
        slurm,
        tmp_path,
        data_root,
        signer,
        *steps,
        "train.steps=20",
        output=tmp_path / "%A_%a.out",
        array="0-1",
    )
    for task in (0, 1):
        assert slurm.wait(f"{array}_{task}") == "COMPLETED", (
            tmp_path / f"{array}_{task}.out"
        ).read_text()
    runs = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("slurm-"))
    assert runs == [f"slurm-{array}-0", f"slurm-{array}-1"]
    for task in (0, 1):
        run_dir = tmp_path / f"slurm-{array}-{task}"
        assert [step for step, _ in scan(run_dir).committed] == [10, 20]
        journal = read(run_dir / METRICS_FILE)
        # every step once: the two tasks never wrote into one run
        assert [r["step"] for r in journal if "loss" in r] == list(range(1, 21))
        (started,) = [r for r in journal if r.get("event") == "job"]
        assert (started["job_id"], started["restart"]) == (f"{array}_{task}", 0)
