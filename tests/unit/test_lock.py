"""One writer per run directory: a second is refused at start; the lock dies with its holder."""

import os
import signal
import subprocess
import sys
import time

import pytest

from recovery import cli
from recovery.errors import RunDirLockedError
from recovery.format.layout import step_dir_name
from recovery.integrity.commits.lock import LOCK_FILE, RunLock
from tests import launcher
from tests.unit.test_checkpointer import _keys, run  # noqa: F401 - _keys: an autouse fixture

HOLDER = """
import sys, time
from pathlib import Path
from recovery.integrity.commits.lock import RunLock
lock = RunLock.acquire(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_writer_is_refused_and_the_lock_dies_with_its_holder(tmp_path, signer):
    run(tmp_path, 4, keep_last=3)
    run_dir = tmp_path / "run"
    proc = launcher.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        in_flight = run_dir / (step_dir_name(6) + ".tmp-abc123")  # the holder's write
        in_flight.mkdir()
        with pytest.raises(RunDirLockedError, match=rf"pid {proc.pid} on host"):
            run(tmp_path, 8, resume="latest")
        assert in_flight.is_dir(), "a refused writer removed the live writer's temp dir"
        # readers take no lock
        trusted = ["--trusted", str(signer.path.parent)]
        assert cli.main(["ls", str(run_dir), *trusted]) == 0
        assert cli.main(["verify", str(run_dir / step_dir_name(4)), *trusted]) == 0
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    _, losses, ck = run(tmp_path, 8, resume="latest")  # the kernel dropped the dead holder's lock
    assert ck.resumed_from.name == step_dir_name(4) and sorted(losses) == [5, 6, 7, 8]
    assert not in_flight.exists()  # now nobody owns it: removed as stale


def test_a_failed_restore_releases_the_lock(tmp_path):
    run(tmp_path, 2)
    with pytest.raises(Exception, match="already holds checkpoints"):
        run(tmp_path, 4)  # a fresh run into a used directory is refused...
    lock = RunLock.acquire(tmp_path / "run")  # ...and holds nothing after
    lock.release()


def test_the_lock_file_names_its_holder_and_a_second_open_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = RunLock.acquire(run_dir)
    try:
        assert f'"pid": {os.getpid()}' in (run_dir / LOCK_FILE).read_text()
        with pytest.raises(RunDirLockedError, match=f"pid {os.getpid()} on host"):
            RunLock.acquire(run_dir)  # a second open file description conflicts, even here
        assert cli.exit_code(RunDirLockedError("x", holder="")) == 26
    finally:
        lock.release()


def test_a_forked_child_that_outlives_its_writer_holds_no_lock(tmp_path):
    # DataLoader workers are forked: flock is shared with them, and they outlive a
    # SIGKILLed parent for a moment
    script = """
import os, sys, time
from pathlib import Path
from recovery.integrity.commits.lock import RunLock
lock = RunLock.acquire(Path(sys.argv[1]))
if os.fork() == 0:
    time.sleep(30)  # the orphan
    os._exit(0)
print("held", flush=True)
time.sleep(60)
"""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = launcher.Popen(
        [sys.executable, "-c", script, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    with pytest.raises(RunDirLockedError):
        RunLock.acquire(run_dir)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    started = time.monotonic()
    RunLock.acquire(run_dir).release()
    assert time.monotonic() - started < 5, "the orphaned child held the lock"
