"""A private single-node SLURM (munged + slurmctld + slurmd) for the tests, run as root.

Nothing system-wide is written: the munge key and socket, slurm.conf, the state, spool,
log and pid files all live in one 0700 temp dir that the teardown removes, and every
client command reaches this cluster through ``SLURM_CONF`` in :attr:`SlurmCluster.env`.
Needs root and Debian's ``slurmctld slurmd slurm-client munge`` (``make test`` installs
them where it can: ``tests/provision.sh``); without them the tests skip, and the run's
closing lines say what to install (:mod:`tests.system`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests import system

SBIN = Path("/usr/sbin")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "sinfo", "scancel", "srun")
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
# states after which a job no longer runs (squeue(1), JOB STATE CODES); every other one
# (PENDING, RUNNING, COMPLETING, and the passing ones such as SIGNALING while slurmctld
# delivers a --signal, CONFIGURING, REQUEUED) is a job still on its way
ENDED = (*FINISHED, "BOOT_FAIL", "DEADLINE", "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "")


def live(state: str) -> bool:
    """Whether a job in ``state`` may still run (a passing state is not an end)."""
    return state not in ENDED


@dataclass
class SlurmCluster:
    """A started cluster: ``env`` is ``os.environ`` plus ``SLURM_CONF``."""

    root: Path
    node: str
    env: dict[str, str]
    startup_s: float

    def run(self, *args: str, check: bool = True) -> str:
        """A client command against this cluster; its stdout."""
        done = subprocess.run(args, env=self.env, text=True, capture_output=True, timeout=30)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def sbatch(self, script: Path, *args: str, env: dict[str, str] | None = None, **opts) -> str:
        """Submit ``script`` (``args`` go to the script); ``opts`` are sbatch options
        (``array="0-1"`` is ``--array=0-1``; ``True``: a bare flag). Returns the job id."""
        flags = [
            f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in opts.items()
        ]
        cmd = ["sbatch", "--parsable", *flags, str(script), *args]
        done = subprocess.run(
            cmd, env={**self.env, **(env or {})}, text=True, capture_output=True, timeout=30
        )
        if done.returncode:
            raise RuntimeError(f"sbatch exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def show(self, job: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (finished jobs too, for MinJobAge=600 s)."""
        out = self.run("scontrol", "-o", "show", "job", job, check=False)
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def state(self, job: str) -> str:
        return self.show(job).get("JobState", "")

    def wait(self, job: str, states: tuple[str, ...] = FINISHED, timeout: float = 60) -> str:
        """Poll until ``job`` (``ID`` or ``ARRAYID_TASK``) is in one of ``states``."""
        end = time.monotonic() + timeout
        while (state := self.state(job)) not in states:
            if time.monotonic() > end:
                raise TimeoutError(f"job {job} not in {states} after {timeout} s (is {state!r})")
            time.sleep(0.2)
        return state

    def requeue(self, job: str) -> None:
        """``scontrol requeue``: SLURM ends the running job (SIGTERM to every process of it,
        SIGKILL KillWait=5 s later) and queues it again under the same job id."""
        self.run("scontrol", "requeue", job)

    def start_now(self, job: str) -> None:
        """Once a requeued ``job`` is pending, start it in 2 s rather than after the
        cred_expire + 1 s (11 s here, 121 s by default) SLURM holds it for. Not at once:
        slurmd revoked the job's credentials when it ended the old run, to the second, and
        refuses ("Job credential revoked", the job FAILED) a launch in that same second."""
        self.wait(job, ("PENDING",))
        self.run("scontrol", "update", f"JobId={job}", "StartTime=now+2")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _hardware() -> str:
    """This machine as ``slurmd -C`` sees it (CPUs, sockets, cores, threads, memory)."""
    line = subprocess.run(
        [str(SBIN / "slurmd"), "-C"], check=True, text=True, capture_output=True
    ).stdout.splitlines()[0]
    fields = []
    for kv in line.split()[1:]:  # drop NodeName=
        key, value = kv.split("=", 1)
        if key == "RealMemory":  # slurmd drains a node that has less than configured
            value = str(int(value) * 9 // 10)
        fields.append(f"{key}={value}")
    return " ".join(fields)


def _conf(d: Path, node: str) -> str:
    ctld_port, slurmd_port = _free_ports(2)
    return f"""\
ClusterName=tests
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# a requeued job is held cred_expire + 1 s (default 120)
AuthInfo=socket={d}/munge/munge.socket,cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
PlugStackConfig={d}/plugstack.conf
MailProg=/bin/true
# no systemd, no cgroups here
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# the scheduler runs every 60 s by default
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
InactiveLimit=0
NodeName={node} NodeAddr=127.0.0.1 {_hardware()} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _pid(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(path.read_text().split()[0])
    return None


def _alive(pid: int) -> bool:
    """Running and not a zombie (the daemons double-fork, and a slow init leaves them
    <defunct> for a moment, which ``kill -0`` would call alive)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _stepds(d: Path) -> list[int]:
    """This cluster's slurmstepd processes: their environment is empty, but their cwd or
    open files (the slurmd log, the job's output) lie under ``d``."""
    pids = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if not proc.name.isdigit() or not (proc / "cmdline").read_bytes().startswith(
                b"slurmstepd"
            ):
                continue
            links = [os.readlink(proc / "cwd")] + [os.readlink(f) for f in (proc / "fd").iterdir()]
            if any(link.startswith(str(d)) for link in links):
                pids.append(int(proc.name))
    return pids


def stop(d: Path) -> None:
    """Cancel every job and wait for them to end (killing slurmd under a running job
    orphans its slurmstepd), stop the daemons, kill what is left, remove ``d``."""
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["scancel", "--quiet", "--user=root"], env=env, timeout=10)
        end = time.monotonic() + 15  # KillWait=5 bounds it
        while time.monotonic() < end:
            queue = subprocess.run(
                ["squeue", "-h", "-o", "%i"], env=env, timeout=10, capture_output=True, text=True
            )
            if queue.returncode or not queue.stdout.strip():
                break
            time.sleep(0.2)
    pidfiles = [d / "run/slurmd.pid", d / "run/slurmctld.pid", d / "munge/munged.pid"]
    pids = [pid for pid in map(_pid, pidfiles) if pid]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < end:
        time.sleep(0.1)
    for pid in [pid for pid in pids if _alive(pid)] + _stepds(d):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(d, ignore_errors=True)


def start(timeout: float = 30) -> SlurmCluster:
    """Start munged, slurmctld and slurmd in a fresh temp dir; return once the node is idle."""
    t0 = time.monotonic()
    d = Path(tempfile.mkdtemp(prefix="slurm-tests."))  # 0700: the munge key lives here
    for sub in ("munge", "state", "spool", "log", "run"):
        (d / sub).mkdir(mode=0o700)
    key = d / "munge/munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    (d / "plugstack.conf").write_text("")  # not /etc/slurm/plugstack.conf
    node = socket.gethostname().split(".")[0]
    try:
        subprocess.run(
            [
                str(SBIN / "munged"),
                f"--key-file={key}",
                f"--socket={d}/munge/munge.socket",
                f"--pid-file={d}/munge/munged.pid",
                f"--log-file={d}/log/munged.log",
                f"--seed-file={d}/munge/munged.seed",
                "--force",  # the socket's directory is 0700: harmless for root
            ],
            check=True,
            capture_output=True,
        )
        (d / "slurm.conf").write_text(_conf(d, node))
        env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
        for daemon in ("slurmctld", "slurmd"):  # each daemonizes and exits 0
            subprocess.run(
                [str(SBIN / daemon), "-f", env["SLURM_CONF"]],
                env=env,
                check=True,
                capture_output=True,
            )
        end = time.monotonic() + timeout
        while True:
            sinfo = subprocess.run(
                ["sinfo", "-h", "-n", node, "-o", "%T"], env=env, capture_output=True, text=True
            )
            if sinfo.stdout.strip() == "idle":
                break
            if time.monotonic() > end:
                raise RuntimeError(f"SLURM node {node} not idle after {timeout} s; logs: {d}/log")
            time.sleep(0.1)
    except BaseException:
        stop(d)
        raise
    return SlurmCluster(d, node, env, time.monotonic() - t0)


@contextlib.contextmanager
def running() -> Iterator[SlurmCluster]:
    """A started cluster, stopped and removed on leaving (a session fixture wraps it);
    skips the test in one line naming what to install when SLURM is not installed."""
    system.require(system.SLURM)
    cluster = start()
    try:
        yield cluster
    finally:
        stop(cluster.root)
