"""Storage that fails under a real run: each ends in one line and a README exit code, and
an unreadable checkpoint is a fallback like a damaged one.

Tests run as root in CI, where permission bits do not bind; the process under test is
started without the capabilities that bypass them (``setpriv``), so the kernel refuses
it for real. Full disk is the kernel's file-size limit (``RLIMIT_FSIZE``): a write past it
fails with ``EFBIG`` the way one past a full disk fails with ``ENOSPC``.
"""

from __future__ import annotations

import os
import resource
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recovery import faults
from recovery.format.layout import step_dir_name
from recovery.integrity.trust import KEY_ENV
from tests import launcher
from tests.integration.conftest import SMALL, TRAIN

pytestmark = pytest.mark.integration

UNPRIVILEGED = (
    [
        "setpriv",
        *(f"--{opt}=-dac_override,-dac_read_search" for opt in ("bounding-set", "inh-caps")),
    ]
    if os.geteuid() == 0
    else []
)
needs_setpriv = pytest.mark.skipif(
    bool(UNPRIVILEGED) and shutil.which("setpriv") is None,
    reason="root without setpriv: permission bits cannot be made to bind",
)


def train(root: Path, data: Path, signer, *extra: str, fsize: int | None = None, **kw):
    """train.py without the permission-bypassing capabilities; returns the finished process."""
    env = {**os.environ, KEY_ENV: str(signer.path), **kw.pop("env", {})}

    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return launcher.Popen(
        [*UNPRIVILEGED, sys.executable, str(TRAIN), f"checkpoint.root={root}",
         f"recipe.data.root={data}", *SMALL, "checkpoint.dvc.enabled=false", *extra],
        cwd=root.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=limit, **kw,
    )  # fmt: skip


def finish(proc) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.fixture
def committed(tmp_path, data_root, signer):
    """A run with checkpoints 10..80 (the tiny run, to its end), root-owned."""
    root = tmp_path / "ckpts"
    root.mkdir()
    code, err = finish(train(root, data_root, signer))
    assert code == 0, err[-3000:]
    return root


@needs_setpriv
def test_a_read_only_checkpoint_root_is_one_line_fresh_and_resumed(
    tmp_path, committed, data_root, signer
):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    fresh.chmod(0o555)
    code, err = finish(train(fresh, data_root, signer))
    assert code == 28 and str(fresh) in one_line(err)
    assert list(fresh.iterdir()) == []
    # resumed: the run directory is read-only, Hydra's log directory in it still writable
    run_dir = committed / "r"
    (run_dir / "hydra").chmod(0o777)
    run_dir.chmod(0o555)
    code, err = finish(train(committed, data_root, signer, "+resume=latest", "train.steps=90"))
    assert code == 28 and "cannot write the run directory" in one_line(err)


def test_the_run_directory_deleted_mid_run_is_one_line(tmp_path, data_root, signer):
    root = tmp_path / "ckpts"
    root.mkdir()
    mark, release = tmp_path / "mark", tmp_path / "release"
    env = {faults.PAUSE_ENV: "step-15", faults.MARK_ENV: str(mark),
           faults.RELEASE_ENV: str(release)}  # fmt: skip
    proc = train(root, data_root, signer, env=env)
    deadline = time.monotonic() + 120
    while not mark.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
        time.sleep(0.05)
    shutil.rmtree(root / "r")
    release.touch()
    code, err = finish(proc)
    assert code == 28 and "the run directory is gone" in one_line(err)


def test_a_full_disk_fails_the_commit_in_one_line_and_leaves_no_temp(tmp_path, data_root, signer):
    root = tmp_path / "ckpts"
    root.mkdir()
    # the journal stays under the limit, every checkpoint file is over it
    code, err = finish(train(root, data_root, signer, fsize=20_000))
    assert code == 14 and "File too large" in one_line(err)
    assert [p.name for p in (root / "r").iterdir() if p.name.startswith("step-")] == []


@needs_setpriv
def test_an_unreadable_file_in_the_newest_checkpoint_is_a_fallback(committed, data_root, signer):
    newest = committed / "r" / step_dir_name(80)
    (newest / "optimizer.safetensors").chmod(0)
    verify = launcher.run(
        [*UNPRIVILEGED, str(Path(sys.executable).parent / "recovery"), "verify", str(newest),
         "--trusted", str(signer.path.parent)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert verify.returncode == 27 and "optimizer.safetensors" in one_line(verify.stderr)
    code, err = finish(train(committed, data_root, signer, "+resume=latest", "train.steps=90"))
    assert code == 0, err[-3000:]
    assert "RESUME FALLBACK" in err and "cannot be read (Permission denied)" in err
    assert f"resumed from {committed / 'r' / step_dir_name(70)}" in err
    assert stat.S_IMODE((newest / "optimizer.safetensors").stat().st_mode) != 0  # re-saved
