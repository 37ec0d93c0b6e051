"""train.py as a submitit job (examples/submitit/submit_train.py) on a real SLURM
(tests/integration/slurm_cluster.py), submitted by submitit's own SLURM executor:
submitit's preemption (SIGTERM, then its SIGUSR2) lands mid-run; the run checkpoints
at the next step boundary, only then does submitit call ``checkpoint()`` and requeue
the job, and the job comes back and finishes bit-identical to an uninterrupted run."""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery import faults
from recovery.format.layout import METRICS_FILE
from recovery.integrity.keys.trust import KEY_ENV
from recovery.run.journal import read
from tests.integration.conftest import ROOT, SMALL, assert_same_run
from tests.integration.slurm_cluster import SlurmCluster, live, running

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "submitit"
OVERRIDES = [o for o in SMALL if not o.startswith("run.name=")]  # train.py: slurm-<job id>


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    with running() as cluster:
        yield cluster


def wait_for(path: Path, text: str, cluster: SlurmCluster, job: str) -> str:
    """Until ``path`` holds ``text``, failing at once if ``job`` ended; its text."""
    end = time.monotonic() + 60
    while text not in (log := path.read_text() if path.exists() else ""):
        state = cluster.state(job)
        assert live(state), f"job {job} {state}:\n{log}"
        assert time.monotonic() < end, f"no {text!r} after 60 s:\n{log}"
        time.sleep(0.05)
    return log


def test_a_submitit_job_preempted_mid_step_checkpoints_then_requeues_bit_identical(
    tmp_path, monkeypatch, request, slurm, reference, data_root, signer, trust
):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    request.addfinalizer(lambda: sys.modules.pop("submit_train", None))
    import submit_train  # the example; the job imports it by name (cloudpickle)

    mark, release = tmp_path / "paused.mark", tmp_path / "release"
    # the job inherits this environment (sbatch exports it); paused after step 20
    for key, value in {
        "SLURM_CONF": slurm.env["SLURM_CONF"],
        "PYTHONPATH": f"{ROOT}:{EXAMPLE}",
        "PYTHONUNBUFFERED": "1",
        KEY_ENV: str(signer.path),
        faults.PAUSE_ENV: "step-20",
        faults.MARK_ENV: str(mark),
        faults.RELEASE_ENV: str(release),
    }.items():
        monkeypatch.setenv(key, value)
    ex = submit_train.executor(tmp_path / "submitit", minutes=30)
    overrides = [f"checkpoint.root={tmp_path}", f"recipe.data.root={data_root}", *OVERRIDES]
    job = ex.submit(submit_train.TrainPy(), *overrides)
    end = time.monotonic() + 60
    while not mark.exists():
        assert live(slurm.state(job.job_id)), job.paths.stdout
        assert time.monotonic() < end, "never paused at step 20"
        time.sleep(0.05)
    # submitit's own preemption: scancel --signal SIGTERM, then scancel --signal USR2
    job._interrupt()
    # the same request, whichever of the two signals SLURM delivered first (two scancel
    # calls: slurmd may deliver the second before the first)
    log = wait_for(job.paths.stdout, "within 2 s of", slurm, job.job_id)
    first = "SIGTERM" if "SIGUSR2 within 2 s of SIGTERM" in log else "SIGUSR2"
    release.touch()
    slurm.start_now(job.job_id)
    assert slurm.wait(job.job_id, timeout=120) == "COMPLETED", job.paths.stdout.read_text()
    out = job.paths.stdout.read_text()
    # the order: the checkpoint of the step boundary, then submitit's checkpoint() and requeue
    at = [
        out.index(s) for s in ("step-00000021 committed", "Calling checkpoint method", "Requeued")
    ]
    assert at == sorted(at), out
    assert slurm.show(job.job_id)["Restarts"] == "1"
    with open(job.paths.result_pickle, "rb") as fh:  # submitit's own file
        assert pickle.load(fh) == ("success", None)
    run_dir = tmp_path / f"slurm-{job.job_id}"  # train.py names it after the job
    journal = read(run_dir / METRICS_FILE)
    preempted = [(r["signal"], r["step"]) for r in journal if r.get("event") == "preempted"]
    assert preempted == [(first, 21)]
    assert [r["step"] for r in journal if r.get("event") == "resume"] == [21]
    jobs = [(r["restart"], r["previous_stop"]) for r in journal if r.get("event") == "job"]
    # the example takes USR2 for the time limit's signal, SIGTERM for a preemption
    stop = "preempted/requeued" if first == "SIGTERM" else "time limit"
    assert jobs == [(0, None), (1, stop)]
    assert_same_run(reference, run_dir, trust)
