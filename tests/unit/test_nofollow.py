"""A writer never writes, moves or deletes through a symlink planted under the run directory."""

import hashlib
import os

import pytest

from recovery.errors import RunDirLockedError, UnsafePathError
from recovery.integrity import nofollow
from recovery.integrity.lock import LOCK_FILE, RunLock, check_held
from recovery.run.journal import Journal


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def decoy(tmp_path):
    """A file outside the run directory that no writer may touch."""
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir()
    path.write_text("credentials\n")
    return path


def test_appended_files_are_never_opened_through_a_link(tmp_path, decoy):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    before = digest(decoy)
    (run_dir / "metrics.jsonl").symlink_to(decoy)
    j = Journal(run_dir / "metrics.jsonl")
    with pytest.raises(UnsafePathError, match=r"metrics.jsonl: expected the run's journal, found"):
        j.write({"event": "start", "run_id": "x"})
    (run_dir / LOCK_FILE).symlink_to(decoy)
    with pytest.raises(UnsafePathError, match=r"\.lock: expected the writer's lock file"):
        RunLock.acquire(run_dir)
    assert digest(decoy) == before


def test_a_move_refuses_a_link_anywhere_on_either_path(tmp_path, decoy):
    run_dir = tmp_path / "run"
    (run_dir / "step-00000002").mkdir(parents=True)
    (run_dir / "abandoned").symlink_to(decoy.parent)
    with pytest.raises(UnsafePathError, match="abandoned: expected a directory of the run"):
        nofollow.rename(run_dir, run_dir / "step-00000002", run_dir / "abandoned/b/step-00000002")
    assert (run_dir / "step-00000002").is_dir() and os.listdir(decoy.parent) == ["secret.txt"]
    (run_dir / "abandoned").unlink()
    (run_dir / "abandoned").mkdir()
    (run_dir / "abandoned" / "b").symlink_to(decoy.parent)
    with pytest.raises(UnsafePathError, match="b: expected a directory of the run"):
        nofollow.rename(run_dir, run_dir / "step-00000002", run_dir / "abandoned/b/step-00000002")
    (run_dir / "abandoned" / "b").unlink()
    nofollow.rename(run_dir, run_dir / "step-00000002", run_dir / "abandoned/b/step-00000002")
    assert (run_dir / "abandoned/b/step-00000002").is_dir()
    (run_dir / "step-00000004").symlink_to(decoy.parent)  # a checkpoint name that is a link
    with pytest.raises(UnsafePathError, match="expected a checkpoint directory"):
        nofollow.rename(run_dir, run_dir / "step-00000004", run_dir / "abandoned/b/step-00000004")


def test_refuse_links_names_the_first_link_below_the_anchor(tmp_path, decoy):
    anchor = tmp_path / "run"
    anchor.mkdir()
    (anchor / "best").symlink_to(decoy.parent)
    with pytest.raises(UnsafePathError, match=r"best: expected a directory of the run"):
        nofollow.refuse_links(anchor, anchor / "best" / "step-1", "a copy")
    nofollow.refuse_links(anchor, anchor / "absent" / "x", "nothing yet")  # absent is fine


def test_a_temp_dir_swapped_for_a_link_is_refused(tmp_path, decoy):
    tmp = tmp_path / "step-00000002.tmp-abc"
    tmp.mkdir()
    made = nofollow.Made(tmp)
    made.check()
    tmp.rename(tmp_path / "moved")
    tmp.symlink_to(decoy.parent)
    with pytest.raises(UnsafePathError, match="expected the temp directory this writer made"):
        made.check()
    tmp.unlink()
    tmp.mkdir()  # another directory under the name: refused too
    with pytest.raises(UnsafePathError, match="was replaced by another"):
        made.check()


@pytest.mark.parametrize("change", ["delete", "rename_over"])
def test_a_lock_file_changed_under_a_holder_lets_no_second_writer_in(tmp_path, change):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = RunLock.acquire(run_dir)
    try:
        if change == "delete":
            (run_dir / LOCK_FILE).unlink()
        else:
            (run_dir / "other").write_text("x")
            os.rename(run_dir / "other", run_dir / LOCK_FILE)
        with pytest.raises(RunDirLockedError, match="another run is writing it"):
            RunLock.acquire(run_dir)  # the lock is on the directory, which did not change
        check_held(run_dir / "step-00000002")  # and it still guards the run
    finally:
        lock.release()


def test_a_run_directory_replaced_under_its_holder_stops_the_next_commit(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = RunLock.acquire(run_dir)
    try:
        run_dir.rename(tmp_path / "moved")
        check_held(run_dir / "step-00000002")  # gone: left to the write, which says so
        run_dir.mkdir()
        second = RunLock.acquire(run_dir)  # a new directory: a new writer may lock it...
        second.release()
        with pytest.raises(RunDirLockedError, match=r"is now another directory .* moved or repl"):
            check_held(run_dir / "step-00000002")  # ...and the first stops before committing
    finally:
        lock.release()
    check_held(run_dir / "step-00000002")  # a released lock checks nothing


def test_dvc_bookkeeping_is_never_written_through_a_link(tmp_path, decoy):
    from recovery.storage import tracking

    run_dir = tmp_path / "run"
    ckpt = run_dir / "step-00000002"
    ckpt.mkdir(parents=True)
    before = digest(decoy)
    tracking.dvc_file(ckpt).symlink_to(decoy)  # DVC would write its record through it
    with pytest.raises(UnsafePathError, match=r"step-00000002.dvc: expected DVC's record"):
        tracking.register(tmp_path, [ckpt])  # refused before DVC is asked
    tracking.dvc_file(ckpt).unlink()
    (run_dir / ".gitignore").symlink_to(decoy)
    with pytest.raises(UnsafePathError, match=r"\.gitignore: expected the .gitignore DVC keeps"):
        tracking.register(tmp_path, [ckpt])
    with pytest.raises(UnsafePathError, match=r"\.gitignore: expected the .gitignore DVC keeps"):
        tracking.untrack(ckpt)
    (run_dir / tracking.TRACKING_FILE).symlink_to(decoy)
    with pytest.raises(UnsafePathError, match="expected the run's DVC tracking record"):
        tracking.record(run_dir, ckpt.name, registered=True)
    assert digest(decoy) == before
