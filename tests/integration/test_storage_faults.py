"""Storage that fails under a real run: each ends in one line and a README exit code, and
an unreadable checkpoint is a fallback like a damaged one.

Tests run as root in CI, where permission bits do not bind; the process under test is
started without the capabilities that bypass them (``setpriv``), so the kernel refuses
it for real. Full disk is the kernel's file-size limit (``RLIMIT_FSIZE``): a write past it
fails with ``EFBIG`` the way one past a full disk fails with ``ENOSPC``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipes.data import META_FILE
from recovery import faults
from recovery.format.layout import METRICS_FILE, parse_step, step_dir_name
from recovery.integrity.commits import full
from recovery.integrity.keys.trust import KEY_ENV
from recovery.integrity.reads import reader
from tests import launcher
from tests.conftest import once
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


def train(
    root: Path, data: Path, signer, *extra: str, fsize: int | None = None,
    unprivileged: bool = False, **kw,
):  # fmt: skip
    """train.py (``unprivileged``: without the permission-bypassing capabilities, for a
    test of permission bits); returns the started process, forked from the preloaded
    launcher (which drops the capabilities ``setpriv`` names, and sets a file-size limit,
    in the child itself: ``tests.launcher.unsetpriv``)."""
    env = {**os.environ, KEY_ENV: str(signer.path), **kw.pop("env", {})}
    if fsize is not None:  # set by the child on itself, as a preexec_fn would
        kw["rlimits"] = {resource.RLIMIT_FSIZE: (fsize, fsize)}
    return launcher.Popen(
        [*(UNPRIVILEGED if unprivileged else []), sys.executable, str(TRAIN),
         f"checkpoint.root={root}", f"recipe.data.root={data}", *SMALL,
         "checkpoint.dvc.enabled=false", *extra],
        cwd=root.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        **kw,
    )  # fmt: skip


def finish(proc) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.fixture
def committed(tmp_path, shared_dir, data_root, signer):
    """A run with checkpoints 10..80 (the tiny run, to its end), root-owned: a copy of one
    made once for the session (the tests change its permissions)."""

    def make(where: Path) -> None:
        (where / "ckpts").mkdir()
        code, err = finish(train(where / "ckpts", data_root, signer))
        assert code == 0, err[-3000:]

    root = tmp_path / "ckpts"
    shutil.copytree(once(shared_dir / "storage-committed", make) / "ckpts", root)
    return root


@needs_setpriv
def test_a_read_only_checkpoint_root_is_one_line_fresh_and_resumed(
    tmp_path, committed, data_root, signer
):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    fresh.chmod(0o555)
    code, err = finish(train(fresh, data_root, signer, unprivileged=True))
    assert code == 28 and str(fresh) in one_line(err)
    assert list(fresh.iterdir()) == []
    # resumed: the run directory is read-only (Hydra's logs, beside it, are writable)
    run_dir = committed / "r"
    run_dir.chmod(0o555)
    resumed = train(
        committed, data_root, signer, "+resume=latest", "train.steps=90", unprivileged=True
    )
    code, err = finish(resumed)
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
    if not (data_root / META_FILE).exists():  # generated under the limit it would fail first
        assert finish(train(tmp_path / "warm", data_root, signer, "train.steps=1"))[0] == 0
    root = tmp_path / "ckpts"
    root.mkdir()
    # the journal stays under the limit, every checkpoint file is over it
    code, err = finish(train(root, data_root, signer, fsize=20_000))
    assert code == 28 and one_line(err) == f"error: {disk_full(root / 'r', errno.EFBIG)}"
    assert [p.name for p in (root / "r").iterdir() if p.name.startswith("step-")] == []


def disk_full(run_dir: Path, code: int = errno.ENOSPC) -> str:
    """The one message of a full disk under ``run_dir``, whatever met it."""
    return str(full.refused(OSError(code, os.strerror(code)), run_dir))


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs the test fills for real (``ENOSPC``); skipped where mounting is not
    allowed (a container without ``CAP_SYS_ADMIN``)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill: {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "--lazy", str(mnt)], check=False)


def fill(disk: Path) -> None:
    """Write zeros into ``disk`` until the kernel says it is full."""
    with open(disk / "filler", "wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(bytes(4096))


def pad_journal(journal: Path, *, slack: bool) -> None:
    """Append one record that leaves the journal's last page (tmpfs allocates by 4 KiB page)
    with room for many more records (``slack``), or exactly full: then the training
    thread's next record needs a page of the full disk."""
    record = b'{"event":"pad","x":""}\n'
    size = journal.stat().st_size + len(record)
    extra = (-size) % 4096 + (64 if slack else 0)
    with open(journal, "ab") as fh:
        fh.write(record[:-3] + b"x" * extra + record[-3:])


# (pause point, checkpoint.async, journal left with room): each fills the disk at another
# moment of a save, so the failure meets another write on another thread
MOMENTS = {
    "between saves: the next background save meets it": ("step-15", True, True),
    "a background save mid-write": ("commit-write-20", True, True),
    "a background save before its signature": ("commit-before-manifest-20", True, True),
    "the last background save, which close() collects": ("commit-write-80", True, True),
    "a synchronous save mid-write": ("commit-write-20", False, True),
    "the journal on the training thread first": ("step-15", True, False),
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_disk_filling_during_a_save_is_exit_28_whenever_it_is_met(
    tmp_path, small_disk, data_root, signer, trust, moment
):
    point, async_save, room = MOMENTS[moment]
    root = small_disk / "ckpts"
    root.mkdir()
    mark, release = tmp_path / "mark", tmp_path / "release"
    env = {faults.PAUSE_ENV: point, faults.MARK_ENV: str(mark), faults.RELEASE_ENV: str(release)}
    # Hydra's log off the small disk: a log line that cannot be written is printed by
    # Python's logging as a traceback of its own, which would hide the line under test
    proc = train(
        root, data_root, signer, f"checkpoint.async={str(async_save).lower()}",
        f"hydra.run.dir={tmp_path / 'hydra'}", env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        run_dir = root / "r"
        # paused on the training thread at step 15, step 10's background save may still be
        # writing (CI under load): the disk fills only once it has committed, else that
        # save, not the one under test, meets the full disk and nothing is left to verify
        while not any(parse_step(p.name) is not None for p in run_dir.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        pad_journal(run_dir / METRICS_FILE, slack=room)
        fill(small_disk)
        release.touch()
        code, out = finish(proc)
    finally:
        if proc.poll() is None:  # paused for good: a failed wait above
            proc.kill()
    line = one_line(out)
    if room:
        assert code == 28 and line == f"error: {disk_full(run_dir)}", out[-3000:]
    else:  # met by the journal first: recipes' handler words it (see the report of issue 26)
        assert code == 28 and "No space left on device" in line, out[-3000:]
    assert not [p for p in run_dir.iterdir() if ".tmp-" in p.name]
    newest = max(p for p in run_dir.iterdir() if parse_step(p.name) is not None)
    assert reader.read_verified(newest, trust).manifest.step == parse_step(newest.name)


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
    resumed = train(
        committed, data_root, signer, "+resume=latest", "train.steps=90", unprivileged=True
    )
    code, err = finish(resumed)
    assert code == 0, err[-3000:]
    assert "RESUME FALLBACK" in err and "cannot be read (Permission denied)" in err
    assert f"at step 70 from {committed / 'r' / step_dir_name(70)}" in err
    assert stat.S_IMODE((newest / "optimizer.safetensors").stat().st_mode) != 0  # re-saved


def _keys_of(signer, where: Path, *, owner: int | None = None, mode: int = 0o700) -> Path:
    """A copy of ``signer``'s key pair in ``where`` (a dev key directory), owned by
    ``owner`` (default: this user) with ``mode``."""
    where.mkdir(parents=True)
    shutil.copy(signer.path, where / "recovery.key")
    shutil.copy(signer.path.parent / "recovery.pub", where / "recovery.pub")
    for path in (where, *where.iterdir()):
        if owner is not None:
            os.chown(path, owner, -1)
    where.chmod(mode)
    return where


def verify(path: Path, *args: str, cwd: Path) -> tuple[int, str]:
    """``recovery verify`` without the permission-bypassing capabilities."""
    cmd = [*UNPRIVILEGED, sys.executable, "-c", "from recovery import cli; cli.main_entry()"]
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    done = subprocess.run(
        [*cmd, "verify", str(path), *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    return done.returncode, done.stdout + done.stderr


@needs_setpriv
def test_a_signing_key_this_user_may_not_read_is_one_line_exit_31(tmp_path, data_root, signer):
    key = _keys_of(signer, tmp_path / "keys") / "recovery.key"
    key.chmod(0)
    root = tmp_path / "ckpts"
    root.mkdir()
    proc = train(root, data_root, signer, unprivileged=True, env={KEY_ENV: str(key)})
    code, out = finish(proc)
    line = one_line(out)
    assert code == 31, out[-3000:]
    assert line.startswith(f"error: {key}: permission denied (the signing key; owner ")
    assert "mode 0000" in line and "point signing.key" in line
    assert not (root / "r").exists()  # refused before the run directory was made


@needs_setpriv
def test_the_dev_key_directories_this_user_may_not_use_are_said_or_passed_over(
    tmp_path, committed, data_root, signer
):
    """Another user's project dev key is not this user's: ``verify`` passes over it (the
    checkpoint verifies against --trusted), and ``train.py`` there cannot sign with it
    (exit 31, naming it); this user's own dev key directory shut to them is exit 31."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a dev key directory to another user")
    project = tmp_path / "project"
    nobody = 65534
    dev = _keys_of(signer, project / ".recovery" / "dev-key", owner=nobody)
    checkpoint = committed / "r" / step_dir_name(80)
    trusted = ["--trusted", str(signer.path.parent)]
    code, out = verify(checkpoint, *trusted, cwd=project)
    assert code == 0 and out.startswith(f"OK {checkpoint}: step 80"), out
    root = project / "ckpts"
    root.mkdir()
    proc = train(root, data_root, signer, unprivileged=True, env={KEY_ENV: ""})
    code, out = finish(proc)
    line = one_line(out)
    assert code == 31, out[-3000:]
    assert line.startswith(f"error: {dev / 'recovery.key'}: permission denied (the dev signing")
    assert f"owner nobody (uid {nobody})" in line
    # this user's own project key, its directory shut (mode 0): verify says so, exit 31
    for path in (dev, *dev.iterdir()):
        os.chown(path, 0, -1)
    dev.chmod(0)
    code, out = verify(checkpoint, *trusted, cwd=project)
    assert code == 31 and "Traceback" not in out, out
    assert out.startswith(f"error: {dev / 'recovery.pub'}: permission denied (the project's dev")
    dev.chmod(0o700)
