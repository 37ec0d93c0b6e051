"""A writer never writes, moves or deletes through a symlink planted under the run directory."""

import hashlib
import os

import pytest

from recovery.errors import RunDirLockedError, UnsafePathError
from recovery.integrity import nofollow
from recovery.integrity.commits.lock import LOCK_FILE, RunLock, check_held
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


def test_only_regular_files_of_one_name_are_appended_to(tmp_path, decoy):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "metrics.jsonl")  # would hang the writer once its buffer filled
    with pytest.raises(UnsafePathError, match="found no regular file"):
        nofollow.open_append(run_dir / "metrics.jsonl", "the run's journal")
    os.mkfifo(run_dir / LOCK_FILE)
    with pytest.raises(UnsafePathError, match=r"\.lock: expected the writer's lock file, found no"):
        RunLock.acquire(run_dir)
    (run_dir / "metrics.jsonl").unlink()
    os.link(decoy, run_dir / "metrics.jsonl")  # a second name of a file outside
    with pytest.raises(UnsafePathError, match="a hard link"):
        nofollow.open_append(run_dir / "metrics.jsonl", "the run's journal")


def test_a_temp_name_that_is_no_directory_is_refused(tmp_path, decoy):
    (tmp_path / "step-1.tmp-a").symlink_to(decoy.parent)
    with pytest.raises(UnsafePathError, match="found a symlink"):
        nofollow.Made(tmp_path / "step-1.tmp-a")
    (tmp_path / "real").mkdir()
    made = nofollow.Made.register(tmp_path / "real")
    assert nofollow.Made.take(tmp_path / "real") is made  # registered once, taken once
    assert nofollow.Made.take(tmp_path / "real") is not made


def test_a_tree_copy_creates_everything_through_descriptors_and_refuses_links(tmp_path, decoy):
    src = tmp_path / "step-00000002"
    (src / "dcp").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(b"weights")
    (src / "dcp" / "__0_0.distcp").write_bytes(b"shard")
    (src / "model.safetensors").chmod(0o444)
    best = tmp_path / "best"
    best.mkdir()
    nofollow.copy_tree(src, best, "copy")
    assert (best / "copy" / "dcp" / "__0_0.distcp").read_bytes() == b"shard"
    assert oct((best / "copy" / "model.safetensors").stat().st_mode & 0o777) == "0o644"
    (src / "stolen").symlink_to(decoy)  # a link planted inside the checkpoint copied
    with pytest.raises(UnsafePathError, match="stolen: expected a file of a checkpoint"):
        nofollow.copy_tree(src, best, "copy2")
    assert not (best / "copy2" / "stolen").exists()
    (tmp_path / "best-link").symlink_to(decoy.parent)
    with pytest.raises(UnsafePathError, match="best-link: expected a directory of the run"):
        nofollow.copy_tree(src, tmp_path / "best-link", "copy")
    assert os.listdir(decoy.parent) == ["secret.txt"]


def test_a_best_mark_naming_a_path_deletes_nothing_outside(tmp_path):
    from recovery.run.saving import retention

    victim = tmp_path / "victim" / "step-00000001"
    victim.mkdir(parents=True)
    best = tmp_path / "run" / "best"
    best.mkdir(parents=True)
    for i, named in enumerate([str(victim), "../../victim/step-00000001"]):
        (best / f"{retention.INCOMING}step-0000000{i}").write_text(named)
    retention.tidy_best(tmp_path / "run")
    assert victim.is_dir() and not list(best.iterdir())


def test_a_commit_below_a_linked_directory_of_the_run_is_refused(tmp_path, decoy):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "warm_start").symlink_to(decoy.parent)
    lock = RunLock.acquire(run_dir)
    try:
        with pytest.raises(UnsafePathError, match="warm_start: expected a directory of the run"):
            check_held(run_dir / "warm_start")
    finally:
        lock.release()
