"""Runs that restart themselves: torchrun's elastic agent, and two agents as two nodes.

Each job is killed mid-run by SIGKILL, at step 35 (checkpoints 10, 20 and 30 committed),
and finishes bit-identical to the uninterrupted 2-rank job. ``+resume=latest`` is on the
command line from the first start: with nothing there yet it starts fresh, so one command
line serves the first start and every restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from recovery import faults
from recovery.format.layout import METRICS_FILE, scan
from recovery.integrity.keys.trust import KEY_ENV
from tests import launcher as preloaded
from tests.integration.conftest import SMALL, TRAIN
from tests.integration.test_distributed import assert_same_job

pytestmark = pytest.mark.integration

PAUSE = "step-35"
FRESH = "yet; starting a fresh run"  # resume=latest with nothing committed: a fresh run
RESTART = "will restart worker group"  # torchrun's agent, on a failed worker group


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Worker(psutil.Process):
    """A process of an agent's job. Its :meth:`environ` is the one it was started with:
    the launcher's record of it (forked from a preloaded server, its ``/proc`` environment
    is the server's), else ``/proc``'s (a fresh interpreter)."""

    def __init__(self, pid: int, records: Path) -> None:
        super().__init__(pid)
        self.records = records

    def environ(self) -> dict[str, str]:
        env = preloaded.recorded(self.records).get(self.pid)
        return env if env is not None else super().environ()


@dataclass
class Agent:
    """One torchrun agent (a node): its process, output, and fault files."""

    name: str
    proc: preloaded.Forked | subprocess.Popen[bytes]
    log: Path
    mark: Path
    release: Path
    records: Path  # the launcher's records of the job's processes (preloaded.RECORD_ENV)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def worker(self, rank: int) -> Worker:
        """The agent's worker process of global rank ``rank`` (its current attempt's)."""
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                worker = Worker(child.pid, self.records)
                if worker.environ().get("RANK") == str(rank):
                    return worker
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        raise AssertionError(f"{self.name}: no worker of rank {rank}:\n{self.output()}")

    def paused_worker(self) -> Worker:
        """The worker that wrote the mark (the one paused at the fault point)."""
        return Worker(int(self.mark.read_text().split()[1]), self.records)


class Launcher:
    """Starts torchrun agents on train.py, forked from the preloaded launcher (the agent
    runs torchrun's code, its workers are its processes: see tests/launcher/server.py); at
    the end kills every process it started."""

    def __init__(self, data_root: Path, key: Path) -> None:
        self.data_root = data_root
        self.key = key
        # every process of the agents' jobs records itself here (preloaded.RECORD_ENV), so
        # the cleanup finds workers that an agent killed by SIGKILL left orphaned
        self.records = Path(tempfile.mkdtemp(prefix="elastic-records-"))
        self.started: list[Agent] = []

    def start(
        self,
        root: Path,
        name: str,
        launcher: list[str],
        *overrides: str,
        pause_at: str = "",
        script: Path | None = None,
    ) -> Agent:
        """Start ``torchrun <launcher> train.py`` on ``root`` (``script``: that script, given
        ``overrides`` as its arguments); ``pause_at`` arms a fault point (reached: the mark
        names the worker's pid; passed once the release file exists)."""
        root.mkdir(parents=True, exist_ok=True)
        mark, release = root / f"{name}.mark", root / f"{name}.release"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", KEY_ENV: str(self.key)}
        env[preloaded.RECORD_ENV] = str(self.records)
        env["LOGLEVEL"] = "INFO"  # torchrun's agent says when it restarts the worker group
        for var in (faults.PAUSE_ENV, faults.MARK_ENV, faults.RELEASE_ENV):
            env.pop(var, None)
        if pause_at:
            env[faults.PAUSE_ENV] = pause_at
            env[faults.MARK_ENV] = str(mark)
            env[faults.RELEASE_ENV] = str(release)
        train = [f"checkpoint.root={root}", f"recipe.data.root={self.data_root}", *SMALL]
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *launcher,
            str(script or TRAIN),
            *([] if script else train),
            *overrides,
        ]
        log = root / f"{name}.log"
        with open(log, "wb") as out:
            proc = preloaded.Popen(
                cmd, cwd=root, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        agent = Agent(name, proc, log, mark, release, self.records)
        self.started.append(agent)
        return agent

    def wait_until(self, ready: Callable[[], bool], what: str, timeout: float = 180) -> None:
        """Poll ``ready`` (a file appearing); fail if an agent exits first or time runs out."""
        deadline = time.monotonic() + timeout
        while not ready():
            for agent in self.started:
                if agent.proc.poll() is not None:
                    pytest.fail(
                        f"{agent.name} exited ({agent.proc.returncode}) before {what}:\n"
                        + agent.output()
                    )
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout:.0f} s")
            time.sleep(0.05)

    def finish(self, *agents: Agent, timeout: float = 240) -> list[int]:
        """Wait for ``agents`` to exit; their exit statuses."""
        deadline = time.monotonic() + timeout
        codes = []
        for agent in agents:
            try:
                codes.append(agent.proc.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{agent.name} still running after {timeout:.0f} s:\n{agent.output()}")
        return codes

    def kill_all(self) -> None:
        """SIGKILL every agent started and every process of their jobs (the workers, each
        in a session of its own, orphaned ones included): those the launcher recorded, and
        any started by a fresh interpreter (found by the variable in its environment); reap
        the agents."""
        mine = []
        for pid in preloaded.recorded(self.records):
            with contextlib.suppress(psutil.NoSuchProcess):
                mine.append(psutil.Process(pid))
        records = str(self.records)
        for proc in psutil.process_iter():
            try:
                if (
                    proc.uids().real == os.getuid()
                    and proc.environ().get(preloaded.RECORD_ENV) == records
                ):
                    mine.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        for proc in mine:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        for agent in self.started:
            if agent.proc.poll() is None:
                agent.proc.kill()
            agent.proc.wait(timeout=30)
        psutil.wait_procs(mine, timeout=30)
        shutil.rmtree(self.records, ignore_errors=True)


@pytest.fixture
def launcher(data_root, signer) -> Iterator[Launcher]:
    started = Launcher(data_root, signer.path)
    try:
        yield started
    finally:
        started.kill_all()


@pytest.fixture
def reference(job) -> Path:
    """The uninterrupted 2-rank job (ddp) to STEPS (the session's, shared with the other
    distributed tests)."""
    return job("ddp", 2)


def journal_events(run_dir: Path) -> list[dict]:
    """The journal's start/resume records, in order."""
    lines = (run_dir / METRICS_FILE).read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [r for r in records if r.get("event") in ("start", "warm_start", "resume")]


def committed(run_dir: Path) -> list[int]:
    return [step for step, _ in scan(run_dir).committed]


# rank 0 only: the lock holder and journal writer, the harder case (rank 1 passed as well
# when tried; each case costs ~30 s of a suite over its 10 minutes)
@pytest.mark.parametrize("victim", [0])
def test_torchrun_restarts_a_job_whose_rank_was_killed_and_it_resumes_bit_identical(
    victim, reference, launcher, tmp_path, trust
):
    """``torchrun --max-restarts=1`` with one rank SIGKILLed at step 35 of the first attempt
    restarts the worker group by itself; the same command line (``+resume=latest``, which
    started the first attempt fresh) resumes the second attempt from step 30, and the job
    ends with exit 0 and every step and tensor equal to the uninterrupted job's. The victim
    is rank 0, the run directory's lock holder and journal writer."""
    root = tmp_path / "elastic"
    agent = launcher.start(
        root,
        "agent",
        ["--standalone", "--nproc-per-node=2", "--max-restarts=1"],
        "+resume=latest",
        pause_at=PAUSE,
    )
    launcher.wait_until(agent.mark.exists, f"a rank at {PAUSE}")
    assert committed(root / "r") == [10, 20, 30]
    worker = agent.worker(victim)
    assert worker.environ()["TORCHELASTIC_RESTART_COUNT"] == "0"  # the first attempt
    worker.send_signal(signal.SIGKILL)
    agent.release.touch()  # the survivor goes on, into a collective with the dead rank
    assert launcher.finish(agent) == [0], agent.output()

    out = agent.output()
    assert out.count(RESTART) == 1 and "restart_count=1" in out, out
    assert FRESH in out  # attempt 0, started by the same +resume=latest
    events = journal_events(root / "r")
    assert [e["event"] for e in events] == ["start", "resume"]
    assert events[1]["step"] == 30 and events[1]["from"].endswith("step-00000030")
    assert events[1]["run_id"] == events[0]["run_id"] and events[1]["world_size"] == 2
    assert_same_job(reference, root / "r", trust, ranks=2)


# the whole node hosting the rendezvous store (killing only its worker passed as well)
@pytest.mark.parametrize("kill", ["agent"])
def test_two_agents_as_two_nodes_killed_and_restarted_resume_bit_identical(
    kill, reference, launcher, tmp_path, trust
):
    """Two torchrun agents (``--nnodes=2 --nproc-per-node=1``, c10d rendezvous on one
    endpoint) sharing one checkpoint root are one 2-rank job. SIGKILL at step 35 of one
    node's worker (``worker``: rank 0's, the lock holder's) or of one whole node, agent and
    worker (``agent``: the node hosting the rendezvous store), fails the job on both nodes
    with 10, 20 and 30 committed; both agents started again with the same command line
    (``+resume=latest``) resume from step 30 and end bit-identical to the uninterrupted job."""
    root = tmp_path / "nodes"
    rdzv = f"elastic-{uuid.uuid4().hex[:12]}"

    port = {"first": free_port(), "second": free_port()}

    def nodes(tag: str, pause_at: str = "") -> list[Agent]:
        args = two_nodes(port[tag], rdzv)
        return [
            launcher.start(root, f"{tag}-node{n}", args, "+resume=latest", pause_at=pause_at)
            for n in range(2)
        ]

    first = nodes("first", PAUSE)
    launcher.wait_until(lambda: all(a.mark.exists() for a in first), f"both nodes at {PAUSE}")
    assert committed(root / "r") == [10, 20, 30]
    ranks = {int(a.paused_worker().environ()["RANK"]): a for a in first}
    assert sorted(ranks) == [0, 1]
    if kill == "worker":
        victim = ranks[0]
        victim.paused_worker().send_signal(signal.SIGKILL)
    else:
        [victim] = [a for a in first if listens(a, port["first"])]
        worker = victim.paused_worker()
        victim.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(psutil.NoSuchProcess):  # its zygote may have been quicker
            worker.send_signal(signal.SIGKILL)
    for agent in first:
        agent.release.touch()
    codes = launcher.finish(*first)
    assert all(code != 0 for code in codes), codes
    assert committed(root / "r") == [10, 20, 30]

    second = nodes("second")
    codes = launcher.finish(*second)
    assert codes == [0, 0], "\n".join(a.output() for a in second)
    assert FRESH in "".join(a.output() for a in first)
    events = journal_events(root / "r")
    assert [e["event"] for e in events] == ["start", "resume"]
    assert events[1]["step"] == 30 and events[1]["world_size"] == 2
    assert_same_job(reference, root / "r", trust, ranks=2)


def two_nodes(port: int, rdzv: str) -> list[str]:
    """torchrun's arguments for one of two agents (one rank each) meeting at ``port``."""
    return [
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={rdzv}",
    ]


def listens(agent: Agent, port: int) -> bool:
    """Whether ``agent`` listens on ``port`` (hosts the c10d rendezvous store there)."""
    conns = psutil.Process(agent.proc.pid).net_connections(kind="tcp")
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)


WORKER = """
import os, sys, time
from pathlib import Path

import torch
import torch.distributed as dist

from recovery.config import DistConfig
from recovery.parallel import world

attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
joining = Path(sys.argv[1]) / "rank-1-joining"
if attempt == 1 and rank == 1:
    joining.touch()
if attempt == 1 and rank == 0:  # the fault: rank 0 of the restarted attempt joins last
    while not joining.exists():
        time.sleep(0.01)
    time.sleep(1)  # staging the fault, not waiting for it: rank 1 meets the old keys first
world.setup(DistConfig(timeout_s=60))
group = dist.new_group(backend="gloo")
total = torch.ones(1)
dist.all_reduce(total)
dist.all_reduce(total, group=group)
print(f"attempt {attempt} rank {rank} sum {int(total.item())}", flush=True)
os._exit(1 if attempt == 0 else 0)  # the first attempt fails, the agent restarts it
"""


def test_a_restarted_attempt_meets_afresh_in_torchruns_shared_store(launcher, tmp_path):
    """torchrun's agent keeps one TCPStore for every attempt of a job, and the first attempt's
    process-group keys stay in it. A restarted attempt whose rank 1 joins before rank 0 used
    to read rank 0's dead address there (gloo: connection refused, the restart failing);
    :func:`recovery.parallel.world.setup` now meets under a namespace the ranks of the
    attempt agree on, so the restarted attempt's groups connect and its collectives run."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    agent = launcher.start(
        tmp_path,
        "agent",
        ["--standalone", "--nproc-per-node=2", "--max-restarts=1"],
        str(tmp_path),
        script=script,
    )
    assert launcher.finish(agent, timeout=120) == [0], agent.output()
    out = agent.output()
    assert out.count(RESTART) == 1, out
    assert "attempt 1 rank 0 sum 4" in out and "attempt 1 rank 1 sum 4" in out, out
