"""The local tier under torchrun: a node lost with its RAM, its ranks' snapshots restored
from the copies their peers hold (issue 30, part 4); the persistent tier promoted from the
ranks' snapshots (part 2)."""

from __future__ import annotations

import json
import signal
import uuid

import psutil
import pytest

from recovery.format.layout import METRICS_FILE, step_dir_name
from recovery.integrity.reads import listed
from tests.integration import test_elastic as elastic
from tests.integration.test_distributed import assert_same_job
from tests.integration.test_elastic import PAUSE, Agent, committed, free_port

pytestmark = pytest.mark.integration

launcher = elastic.launcher  # the two-node tests' fixtures: agents, the reference job
reference = elastic.reference


def test_a_node_lost_with_its_ram_is_restored_from_its_peers_copy_bit_identical(
    reference, launcher, tmp_path, trust
):
    """Two torchrun agents as two nodes (``--nnodes=2 --nproc-per-node=1``), each with a
    node-local root of its own, snapshot every 3 steps (persistent every 10) and send each
    snapshot to the other node. At step 35 (persistent 30, snapshots up to 33) one node
    dies, agent and worker (SIGKILL), the other's worker fails with it, and the dead
    node's RAM is wiped (a host replaced). Both agents started again with the same command
    line resume from step 33: the rank on the new node receives its snapshot from the
    other node's copy, verified when read; the job ends bit-identical to the uninterrupted
    one, and each node's run directory in RAM is removed."""
    root = tmp_path / "nodes"
    rdzv = f"tiers-{uuid.uuid4().hex[:12]}"
    ram = {n: tmp_path / f"ram{n}" for n in range(2)}

    def nodes(port: int, pause_at: str = "") -> list[Agent]:
        args = elastic.two_nodes(port, rdzv)
        tier = ["checkpoint.local.every_steps=3", "+resume=latest"]
        return [
            launcher.start(
                root,
                f"{pause_at or 'again'}-node{n}",
                args,
                *tier,
                f"checkpoint.local.root={ram[n]}",
                pause_at=pause_at,
            )
            for n in range(2)
        ]

    first = nodes(free_port(), PAUSE)
    launcher.wait_until(lambda: all(a.mark.exists() for a in first), f"both nodes at {PAUSE}")
    # step 30's promotion runs on in the background while the workers pause
    launcher.wait_until(lambda: committed(root / "r") == [10, 20, 30], "step 30 promoted")

    def settled() -> bool:  # each node: its rank's snapshot of 33 and a copy of the other's
        # (the round that sends step 33 runs on in the background while the workers pause;
        # snapshot 30 stays beside it when 30's promotion held it as 33's round retired)
        for n in range(2):
            runs = list(ram[n].iterdir())
            dirs = sorted(d.name for d in runs[0].iterdir()) if len(runs) == 1 else []
            if not (len(dirs) == 2 and dirs[0].startswith("rank") and "replica" in dirs[1]):
                return False
            if any("step-00000033" not in {s.name for s in (runs[0] / d).iterdir()} for d in dirs):
                return False
        return True

    launcher.wait_until(settled, "the copies of step 33 on both nodes", timeout=60)
    lost = first[1]
    worker = lost.paused_worker()
    lost.proc.send_signal(signal.SIGKILL)
    worker.send_signal(signal.SIGKILL)
    psutil.wait_procs([worker], timeout=30)
    for agent in first:
        agent.release.touch()
    launcher.finish(*first)
    for path in sorted(ram[1].rglob("*"), reverse=True):  # the replaced host: nothing in RAM
        path.rmdir() if path.is_dir() else path.unlink()

    second = nodes(free_port())
    codes = launcher.finish(*second)
    assert codes == [0, 0], "\n".join(a.output() for a in second)
    records = [json.loads(line) for line in (root / "r" / METRICS_FILE).read_text().splitlines()]
    resumes = [r for r in records if r.get("event") == "resume"]
    assert [(r["step"], r["world_size"], r["tier"]) for r in resumes] == [(33, 2, "local")], resumes
    assert "no snapshot of rank" in second[1].output(), second[1].output()
    # every persistent checkpoint promoted from the ranks' snapshots, none taken again,
    saves = [(r["step"], r["mode"]) for r in records if r.get("event") == "checkpoint"]
    assert {mode for _, mode in saves} == {"promoted"} and len(saves) >= 4, saves
    assert (33, "promoted") in saves, saves  # the step resumed from, made persistent at once
    last = root / "r" / step_dir_name(committed(root / "r")[-1])
    assert listed.read_manifest(last, trust).recovery["promoted"] is True
    assert_same_job(reference, root / "r", trust, ranks=2)
    assert [list(ram[n].iterdir()) for n in range(2)] == [[], []]
