"""An attacker who can write into a run directory, between real steps of real ``train.py``
processes: no symlink, lock or journal trick steers the writer, and nothing outside the
run directory is touched (checked by digest of decoys outside it)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recovery import faults
from recovery.format.layout import METRICS_FILE, scan, step_dir_name
from recovery.integrity.commits.lock import LOCK_FILE
from recovery.integrity.keys.trust import KEY_ENV
from tests import launcher
from tests.integration.conftest import SMALL, STEPS, TRAIN, assert_same_run


def tree_digest(path: Path) -> str:
    """One digest of every file name and content under ``path`` (or of the file)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        h.update(str(f.relative_to(path.parent)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@pytest.fixture
def decoy(tmp_path):
    """A directory outside every run, holding a secret: no writer may touch either."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("aws_secret_access_key = do-not-touch\n")
    before = tree_digest(outside)
    yield outside
    assert tree_digest(outside) == before, "a writer touched a file outside the run directory"


class Trainer:
    """``train.py`` processes on the shared tiny recipe, started and paused by hand."""

    def __init__(self, tmp_path: Path, data_root: Path, signer) -> None:
        self.tmp = tmp_path
        self.data_root = data_root
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", KEY_ENV: str(signer.path)}

    def cmd(self, root: Path, *overrides: str) -> list[str]:
        return [
            sys.executable,
            str(TRAIN),
            f"checkpoint.root={root}",
            f"recipe.data.root={self.data_root}",
            *SMALL,
            *overrides,
        ]

    def run(self, root: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
        root.mkdir(parents=True, exist_ok=True)
        return launcher.run(
            self.cmd(root, *overrides),
            cwd=root,
            capture_output=True,
            text=True,
            timeout=300,
            env=self.env,
        )

    def paused(self, root: Path, point: str, *overrides: str) -> tuple[subprocess.Popen, Path]:
        """A run paused at ``point``; touch the returned file to let it go on."""
        root.mkdir(parents=True, exist_ok=True)
        mark, release = root / "paused.mark", root / "release"
        env = {
            **self.env,
            faults.PAUSE_ENV: point,
            faults.MARK_ENV: str(mark),
            faults.RELEASE_ENV: str(release),
        }
        proc = launcher.Popen(
            self.cmd(root, *overrides),
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 180
        while not mark.exists():
            if proc.poll() is not None:
                pytest.fail(f"exited ({proc.returncode}) before {point}:\n{proc.stdout.read()}")
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"never reached {point}")
            time.sleep(0.02)
        return proc, release


@pytest.fixture
def trainer(tmp_path, data_root, signer):
    return Trainer(tmp_path, data_root, signer)


def finish(proc: subprocess.Popen, release: Path) -> tuple[int, str]:
    release.touch()
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def test_planted_symlinks_are_refused_and_never_written_through(trainer, tmp_path, decoy):
    secret = decoy / "secret.txt"
    for name, target, expected in [
        (LOCK_FILE, secret, "expected the writer's lock file, found a symlink"),
        (METRICS_FILE, secret, "expected the run's journal, found a symlink"),
        ("best", decoy, "expected the run's best-checkpoint directory, found a symlink"),
    ]:
        root = tmp_path / name.strip(".")
        (root / "r").mkdir(parents=True)
        (root / "r" / name).symlink_to(target)
        done = trainer.run(root, "train.steps=10", "checkpoint.keep_best=true")
        assert done.returncode == 5, done.stdout + done.stderr
        assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_temp_directory_swapped_for_a_link_mid_commit_is_refused(trainer, tmp_path, decoy):
    root = tmp_path / "swap"
    proc, release = trainer.paused(root, "commit-before-manifest-10", "train.steps=10")
    (tmp,) = scan(root / "r").stale
    tmp.rename(root / "moved-away")
    tmp.symlink_to(decoy)  # the manifest and the rename would go through it
    code, out = finish(proc, release)
    assert code == 5 and "expected the temp directory this writer made" in out, out
    assert not scan(root / "r").committed


def test_deleting_or_replacing_the_lock_file_lets_no_second_writer_in(
    trainer, tmp_path, reference, trust
):
    root = tmp_path / "lock"
    a, release = trainer.paused(root, "step-30")
    run_dir = root / "r"
    (run_dir / LOCK_FILE).unlink()
    b = trainer.run(root, "+resume=latest")
    assert b.returncode == 26 and "another run is writing it" in b.stderr, b.stdout + b.stderr
    (run_dir / "planted").write_text("{}")
    os.rename(run_dir / "planted", run_dir / LOCK_FILE)
    b = trainer.run(root, "+resume=latest")
    assert b.returncode == 26 and "another run is writing it" in b.stderr, b.stdout + b.stderr
    code, out = finish(a, release)
    assert code == 0, out
    assert_same_run(reference, run_dir, trust)  # one writer, one history


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_writer_whose_run_directory_is_replaced_stops_before_its_next_commit(
    trainer, tmp_path, mode
):
    root = tmp_path / "moved"
    a, release = trainer.paused(root, "step-10", f"checkpoint.async={mode == 'async'}")
    run_dir = root / "r"
    deadline = time.monotonic() + 60
    while not (run_dir / step_dir_name(10)).is_dir():  # a background save of 10 in flight
        assert time.monotonic() < deadline, "step 10 was never committed"
        time.sleep(0.05)
    run_dir.rename(root / "r.moved")
    run_dir.mkdir()  # another directory under the run's name, as a second writer would make
    code, out = finish(a, release)
    assert code == 26 and "this writer's lock no longer guards the run" in out, out
    assert "is now another directory" in out and "Traceback" not in out, out
    assert not scan(run_dir).committed and not scan(run_dir).stale
    assert [s for s, _ in scan(root / "r.moved").committed] == [10]


def copy_of(reference: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "copy" / "r"
    shutil.copytree(reference, run_dir)
    return run_dir


def append(run_dir: Path, record: dict) -> None:
    with open(run_dir / METRICS_FILE, "a") as fh:
        fh.write(json.dumps(record) + "\n")


def test_a_forged_retirement_is_ignored_and_the_rollback_refused(trainer, tmp_path, reference):
    run_dir = copy_of(reference, tmp_path)
    shutil.rmtree(run_dir / step_dir_name(STEPS))  # the newest checkpoint deleted...
    append(run_dir, {"event": "retired", "steps": [STEPS]})  # ...and the deletion hidden
    done = trainer.run(run_dir.parent, "+resume=latest", "checkpoint.strict_resume=true")
    out = done.stdout + done.stderr
    assert done.returncode == 25, out
    assert "JOURNAL EVENTS IGNORED" in out and "('retired'): unsigned" in out
    assert f"the run committed step {STEPS}" in done.stderr


def test_a_forged_abandonment_moves_nothing(trainer, tmp_path, reference, decoy):
    run_dir = copy_of(reference, tmp_path)
    to = "abandoned/from-00000060-20261201T000000"
    append(run_dir, {"event": "abandoned", "from_step": 60, "steps": [70, 80], "to": to})
    (run_dir / "abandoned").symlink_to(decoy)  # where the forged move would have gone
    done = trainer.run(run_dir.parent, "+resume=latest")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "JOURNAL EVENTS IGNORED" in out and "('abandoned')" in out
    assert [s for s, _ in scan(run_dir).committed] == [60, 70, 80]


def test_a_branch_into_a_planted_link_moves_nothing_out(trainer, tmp_path, reference, decoy):
    run_dir = copy_of(reference, tmp_path)
    (run_dir / "abandoned").symlink_to(decoy)
    done = trainer.run(run_dir.parent, "+resume=60")  # a branch: 70 and 80 move aside
    assert done.returncode == 5, done.stdout + done.stderr
    assert "abandoned: expected a directory of the run" in done.stderr
    assert [s for s, _ in scan(run_dir).committed] == [60, 70, 80]
