"""DVC tracking on a real DVC repository: register, push, retention, fresh machine, locks, sync."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from recovery import cli
from recovery.config import CheckpointConfig, DvcConfig
from recovery.format.layout import step_dir_name
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal
from recovery.storage import tracking
from tests import launcher
from tests.conftest import tiny_state, train_steps

pytestmark = pytest.mark.integration

DVC = str(Path(sys.executable).with_name("dvc"))


def dvc(root: Path, *args: str) -> None:
    launcher.run([DVC, *args], cwd=root, check=True, capture_output=True)


@pytest.fixture
def project(tmp_path):
    """A git + DVC repository with a local default remote, as `make demo` sets up."""
    root = tmp_path / "proj"
    root.mkdir()
    launcher.run(["git", "init", "-q"], cwd=root, check=True)
    dvc(root, "init", "-q")
    dvc(root, "config", "core.analytics", "false")
    dvc(root, "config", "cache.type", "hardlink,symlink")
    dvc(root, "remote", "add", "-d", "local", str(tmp_path / "remote"))
    return root


def train(
    root,
    steps,
    signer,
    trust,
    prov,
    *,
    resume=None,
    keep_last=2,
    every=2,
    push=True,
    close_timeout="120s",
    differential=None,
    make_state=tiny_state,
    step_fn=lambda state: train_steps(state, 1),
):
    state = make_state()
    run_dir = root / "checkpoints" / "r"
    journal = Journal(run_dir / "metrics.jsonl")
    ck = Checkpointer(
        CheckpointConfig(
            root=str(root / "checkpoints"),
            every_steps=every,
            keep_last=keep_last,
            dvc=DvcConfig(push=push, close_timeout=close_timeout),
            **({"differential": differential} if differential else {}),
        ),
        run_dir,
        final_step=steps,
        signer=signer,
        trust=trust,
        provenance=prov,
        config={"seed": 0},
        journal=journal,
    )
    step = ck.restore(state, resume)
    durations = []
    while step < steps:
        t0 = time.perf_counter()
        step_fn(state)
        step += 1
        ck.maybe_save(state, step)
        durations.append(time.perf_counter() - t0)
    ck.close()
    journal.close()
    return state, run_dir, durations


def test_registered_pushed_and_retention_untracks(project, signer, trust, prov, tmp_path):
    _, run_dir, _ = train(project, 6, signer, trust, prov)
    assert sorted(p.name for p in run_dir.glob("*.dvc")) == [
        "step-00000004.dvc",
        "step-00000006.dvc",
    ]
    assert (run_dir / ".gitignore").read_text().split() == ["/step-00000004", "/step-00000006"]
    st = tracking.status(run_dir)
    assert st["step-00000006"].registered and st["step-00000006"].pushed
    assert any((tmp_path / "remote").rglob("*"))
    out = tracking.dvc_file(run_dir / step_dir_name(6)).read_text()
    assert "md5:" in out and "nfiles: 6" in out  # five data files and model.sig


def test_fresh_machine_resume_fetches_from_the_remote(project, signer, trust, prov):
    ref, _, _ = train(project, 8, signer, trust, prov)  # the uninterrupted reference
    shutil.rmtree(project / "checkpoints")
    # the run that died: 6 steps, pushed; then the machine is gone but git kept the .dvc files
    _, run_dir, _ = train(project, 6, signer, trust, prov)
    keep = {p.name: p.read_bytes() for p in run_dir.glob("*.dvc")} | {
        ".gitignore": (run_dir / ".gitignore").read_bytes()
    }
    shutil.rmtree(run_dir)
    shutil.rmtree(project / ".dvc" / "cache")
    run_dir.mkdir(parents=True)
    for name, data in keep.items():
        (run_dir / name).write_bytes(data)
    state, _, _ = train(project, 8, signer, trust, prov, resume="latest")
    for k, v in ref.components["model"].state_dict().items():
        assert torch.equal(state.components["model"].state_dict()[k], v), k


LOCKER = """
import sys, time, warnings
warnings.filterwarnings("ignore")
from dvc.repo import Repo
repo = Repo(sys.argv[1])
repo.lock.lock()
open(sys.argv[2], "w").close()
time.sleep(float(sys.argv[3]))
repo.lock.unlock()
"""


def hold_lock(root: Path, seconds: float, tmp_path: Path) -> subprocess.Popen:
    mark = tmp_path / "locked"
    proc = launcher.Popen([sys.executable, "-c", LOCKER, str(root), str(mark), str(seconds)])
    while not mark.exists():
        assert proc.poll() is None, "the lock holder died"
        time.sleep(0.05)
    return proc


def test_a_held_lock_neither_crashes_nor_stalls_training(project, signer, trust, prov, tmp_path):
    holder = hold_lock(project, 6.0, tmp_path)
    _, run_dir, durations = train(project, 6, signer, trust, prov, push=False)
    holder.wait()
    assert max(durations) < 1.0, durations  # no step waited for DVC
    st = tracking.status(run_dir)
    assert st["step-00000006"].registered  # completed after the lock was released


def test_sync_finishes_what_was_left_pending(project, signer, trust, prov, tmp_path, capsys):
    holder = hold_lock(project, 8.0, tmp_path)
    _, run_dir, _ = train(project, 4, signer, trust, prov, close_timeout="1s")
    assert not tracking.status(run_dir).get("step-00000004", tracking.Status()).registered
    assert cli.main(["ls", str(run_dir), "--json", "--allow-untrusted"]) == 0
    rows = json.loads(capsys.readouterr().out)["checkpoints"]
    assert {r["dvc"] for r in rows if r["step"]} == {"pending"}
    holder.wait()
    assert cli.main(["sync", str(run_dir), "--push"]) == 0
    st = tracking.status(run_dir)
    assert st["step-00000004"].registered and st["step-00000004"].pushed
