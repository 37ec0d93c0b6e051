"""examples/slurm/multinode.sbatch on a real SLURM (tests/integration/slurm_cluster.py), one
node with two ranks: srun starts torchrun, whose c10d rendezvous comes from SLURM's
variables; the time limit's SIGUSR1 reaches every process of the job (each rank twice:
from SLURM and from its agent, one request), the ranks checkpoint one step together and
rank 0 requeues the job. (Run on to the end, the requeued job was bit-identical to the
uninterrupted two-rank job, 2026-12-03; a resume under torchrun is tested in
test_distributed, and a second start here costs 20-60 s.)"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest

from recovery import faults
from recovery.format.layout import METRICS_FILE, scan
from recovery.integrity.keys.trust import KEY_ENV
from recovery.run.journal import read
from tests.integration.conftest import ROOT, SMALL
from tests.integration.slurm_cluster import SlurmCluster, live, running

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "examples" / "slurm" / "multinode.sbatch"
OVERRIDES = [o for o in SMALL if not o.startswith("run.name=")]  # train.py: slurm-<job id>


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    with running() as cluster:
        yield cluster


def test_a_torchrun_job_started_by_srun_checkpoints_once_and_requeues_itself_on_the_time_limit(
    tmp_path, slurm, data_root, signer
):
    out, mark, release = tmp_path / "job.out", tmp_path / "paused.mark", tmp_path / "release"
    env = {
        "PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "NPROC_PER_NODE": "2",
        KEY_ENV: str(signer.path),
        faults.PAUSE_ENV: "step-30",  # both ranks pause there, after its checkpoint
        faults.MARK_ENV: str(mark),
        faults.RELEASE_ENV: str(release),
    }
    jid = slurm.sbatch(
        SCRIPT,
        f"checkpoint.root={tmp_path}",
        f"recipe.data.root={data_root}",
        "dist.strategy=ddp",
        *OVERRIDES,
        env=env,
        chdir=ROOT,
        output=out,
        nodes=1,
    )
    end = time.monotonic() + 120
    while not mark.exists():
        assert live(slurm.state(jid)), out.read_text()
        assert time.monotonic() < end, "never paused at step 30"
        time.sleep(0.05)
    # the time limit's lead signal (--signal=USR1@120), to every process of every step
    slurm.run("scancel", "--signal=USR1", jid)
    # every rank gets it from SLURM, and its agent passes its own on: the same request (a
    # copy that comes while the first is pending merges with it, as signals do)
    while not (
        (log := out.read_text()).count("SIGUSR1 received") == 2
        and log.count("closing signal SIGUSR1") == 2
    ):
        assert slurm.state(jid) == "RUNNING" and time.monotonic() < end, log
        time.sleep(0.05)
    release.touch()
    slurm.wait(jid, ("PENDING",), timeout=60)  # requeued by rank 0
    log = out.read_text()
    slurm.run("scancel", jid)  # its resume is train.py's under torchrun (test_distributed)
    assert f"rendezvous {slurm.node}:" in log
    assert "second preemption signal" not in log
    assert "preempted: SIGUSR1: checkpointed step 31" in log
    assert log.count("requeued SLURM job") == 1, log  # rank 0 only
    assert slurm.show(jid)["Restarts"] == "1"
    run_dir = tmp_path / f"slurm-{jid}"  # named by train.py after the job
    assert [s for s, _ in scan(run_dir).committed] == [20, 30, 31]  # keep_last=3
    journal = read(run_dir / METRICS_FILE)
    preempted = [(r["signal"], r["step"]) for r in journal if r.get("event") == "preempted"]
    assert preempted == [("SIGUSR1", 31)]
    assert [r["step"] for r in journal if "loss" in r] == list(range(1, 32))
