"""The local tier on real processes: SIGKILL in every commit phase of a local snapshot and
of a promotion, then the same command resumes from the newest step that verifies in either
tier and trains exactly the uninterrupted run (tests/fixtures/own_loop.py: 12 steps, a
snapshot every 2, promoted every 6)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from recovery.format.layout import scan, step_dir_name
from recovery.integrity.keys.trust import KEY_ENV
from recovery.run.journal import effective_steps, read
from recovery.run.restoring import choose
from recovery.tools.drill import flat_tensors
from tests.conftest import once
from tests.integration.conftest import run_killed_at

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LOOP = ROOT / "tests" / "fixtures" / "own_loop.py"


def tiered(
    root: Path, signer, *, pause_at: str | None = None, async_save: bool = False
) -> tuple[int, str]:
    """Run the loop in ``root`` (run dir ``root/run``, local tier under ``root/shm``)."""
    env = {**os.environ, KEY_ENV: str(signer.path)}
    cmd = [sys.executable, str(LOOP), "--run-dir", str(root / "run"), "--steps", "12"]
    cmd += ["--every", "6", "--local-every", "2", "--local-root", str(root / "shm")]
    cmd += ["--async"] if async_save else []
    return run_killed_at(cmd, env=env, cwd=root, pause_at=pause_at)


@pytest.fixture(scope="module")
def uninterrupted(shared_dir, signer) -> Path:
    def make(root: Path) -> None:
        code, out = tiered(root, signer)
        assert code == 0, out

    return once(shared_dir / "tiered-reference", make) / "run"


def state_of(run_dir: Path, trust) -> dict[str, torch.Tensor]:
    tree = choose.load(run_dir / step_dir_name(12), trust).decoded.tree
    return flat_tensors({k: tree[k] for k in ("model", "optimizer")})


@pytest.mark.parametrize(
    ("kill_at", "resumed", "async_save"),
    [
        ("step-9", 8, False),  # a process crash between snapshots: the newest local one
        ("local-write-8", 6, False),  # snapshot 8 half written: 6 (local, then persistent)
        ("local-before-manifest-8", 6, False),
        ("local-before-rename-8", 6, False),
        ("promote-write-6", None, False),  # promotion of 6 killed: training went on meanwhile
        ("promote-before-manifest-6", None, False),
        ("promote-before-rename-6", None, False),
        ("promote-before-rename-12", 12, False),  # the last step, local only: resumed, promoted
        # checkpoint.async: the last snapshot (to be promoted, so never skipped) killed on its
        # writing thread; whichever earlier one was not skipped is resumed (the same losses
        # and state as the synchronous reference: saving never changes what is trained)
        ("local-before-rename-12", None, True),
    ],
)
def test_sigkill_in_every_phase_of_both_tiers_resumes_the_newest_verified_step_exactly(
    tmp_path, signer, trust, uninterrupted, kill_at, resumed, async_save
):
    code, out = tiered(tmp_path, signer, pause_at=kill_at, async_save=async_save)
    assert code == -9, out
    run_dir, local = tmp_path / "run", next((tmp_path / "shm").glob("*/rank0"))
    newest_local = scan(local).committed[-1][0]
    if kill_at.startswith("promote"):  # the killed promotion never published its step
        step = int(kill_at.rsplit("-", 1)[1])
        assert step not in [s for s, _ in scan(run_dir).committed]
        assert any(p.name.startswith(step_dir_name(step)) for p in scan(run_dir).stale)
    if resumed is None:  # whatever the training thread reached before the kill
        resumed = newest_local
    code, out = tiered(tmp_path, signer, async_save=async_save)
    assert code == 0, out
    events = read(run_dir / "metrics.jsonl")
    (event,) = [r for r in events if r.get("event") == "resume"]
    assert (event["step"], event["tier"]) == (resumed, "local")
    assert event["from"] == str(local / step_dir_name(resumed))
    # the redone steps are the dead process's steps, bit for bit, and so is the end state
    ref, got = (
        effective_steps(uninterrupted / "metrics.jsonl"),
        effective_steps(run_dir / "metrics.jsonl"),
    )
    assert sorted(got) == sorted(ref) == list(range(1, 13))
    assert all(got[s]["loss"] == ref[s]["loss"] for s in ref)
    a, b = state_of(uninterrupted, trust), state_of(run_dir, trust)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not local.exists()  # the run ended with its newest step persistent
    assert scan(run_dir).stale == []


def test_the_tiers_benchmark_runs_end_to_end(tmp_path):
    """make bench-tiers on a tiny state (speed is never asserted): one kill, the two-tier
    layout alone at the intervals given (each layout's processes cost ~10 s of start-up
    here, the calibration pass two more: its arithmetic is tests/unit/test_bench_tiers.py's)."""
    from tests import launcher

    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_tiers.py"), "--size-mb", "1"]
    cmd += ["--steps", "12", "--step-ms", "1", "--kills", "1", "--every", "6"]
    cmd += ["--local-every", "2", "--dir", str(tmp_path), "--shm", str(tmp_path / "shm")]
    cmd += ["--layouts", "two"]
    done = launcher.run([*cmd, "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    (kill,) = result["kills"]
    two = result["two_tiers"]
    assert two["runs"][0]["redone"] == [kill % 2] and "one_tier" not in result
    assert result["intervals"] == {"given": True, "every": 6, "local_every": 2}
    assert two["local_resume"]["verified_load_s"] > 0
    assert "two tiers: " in done.stdout and "local resume: verified load" in done.stdout


def test_the_tiers_benchmark_runs_on_a_slow_store_it_mounts_and_unmounts(tmp_path):
    """make bench-tiers' slow-store line, tiny: the persistent run directory on a throttled
    FUSE mount under --dir, gone again once the bench is done."""
    from tests import launcher
    from tests.integration.test_slowstore import slowstore

    slowstore()  # skips, naming what to install, where FUSE is missing
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_tiers.py"), "--size-mb", "1"]
    cmd += ["--steps", "12", "--step-ms", "1", "--kills", "1", "--every", "6"]
    cmd += ["--local-every", "2", "--dir", str(tmp_path), "--shm", str(tmp_path / "shm")]
    cmd += ["--layouts", "two", "--store-mbps", "200"]
    done = launcher.run([*cmd, "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    store = json.loads(out.read_text())["stores"]["200"]
    assert store["store_mbps"] == 200 and store["two_tiers"]["runs"][0]["redone"]
    assert "slow store of 200 MB/s" in done.stdout
    assert not [p for p in tmp_path.rglob("*") if os.path.ismount(p)]
