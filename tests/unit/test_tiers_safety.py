"""The local tier's safety, in process: a snapshot that is the only copy is never deleted,
its directories in a shared /dev/shm are private, its RAM check holds once the optimizer
state exists, a promotion's temp directory is not swapped, and a local snapshot is never
counted as a persistent checkpoint."""

import os
import shutil
import stat
import threading
from pathlib import Path

import pytest

from recovery import faults
from recovery.errors import CommitError, StorageError, UnsafePathError
from recovery.format.layout import TEMP_MARK, scan, step_dir_name
from recovery.integrity.commits.private import PrivateDir
from recovery.run.journal import read
from recovery.run.restoring import choose
from recovery.run.saving import retention
from recovery.run.tiers import rules
from recovery.storage import tracking
from tests.conftest import tiny_state, train_steps
from tests.unit.tiered import checkpointer, crash_at

KEY = "checkpoint.local.root"


@pytest.fixture
def paused(tmp_path, monkeypatch):
    """Arm a fault point that pauses this process's promotion thread until released; yield
    (wait until it is there, release it)."""
    mark, release = tmp_path / "mark", tmp_path / "release"
    monkeypatch.setattr(faults, "_passed", set())
    monkeypatch.setenv(faults.MARK_ENV, str(mark))
    monkeypatch.setenv(faults.RELEASE_ENV, str(release))

    def arm(point: str) -> None:
        monkeypatch.setenv(faults.PAUSE_ENV, point)

    def there() -> None:
        for _ in range(1000):
            if mark.exists():
                return
            threading.Event().wait(0.01)
        raise AssertionError("the promotion never reached its pause")

    yield arm, there, lambda: release.touch()
    release.touch()  # a failed test never leaves a thread paused (the process would hang)


def _plant(run_dir: Path, step: int) -> Path:
    """A symlink planted where step ``step``'s promotion is about to publish: it fails."""
    link = run_dir / step_dir_name(step)
    link.symlink_to(run_dir.parent)
    return link


def _temp(run_dir: Path, step: int) -> Path:
    (tmp,) = run_dir.glob(f"{step_dir_name(step)}{TEMP_MARK}*")
    return tmp


def _promoting(tmp_path, signer, trust, prov, paused, point: str, steps: int):
    """A run to step 12 trained ``steps`` steps, its promotion paused at ``point``."""
    arm, there, _ = paused
    ck = checkpointer(tmp_path, signer, trust, prov, final=12)
    state = tiny_state()
    ck.restore(state, "latest")
    arm(point)
    for step in range(1, steps + 1):
        train_steps(state, 1)
        ck.maybe_save(state, step)
    there()
    return ck


def test_close_keeps_the_snapshot_whose_promotion_failed_though_the_failure_was_told(
    tmp_path, signer, trust, prov, paused
):
    release = paused[2]
    ck = _promoting(tmp_path, signer, trust, prov, paused, "promote-write-12", 12)
    (snap,) = [p for _, p in ck.local.held()]
    link = _plant(ck.run_dir, 12)  # the promotion refuses to publish through it
    release()
    with pytest.raises(UnsafePathError):
        ck.flush()  # told here (a with-block then closes)
    link.unlink()
    ck.close()
    assert [s for s, _ in scan(ck.run_dir).committed] == [6]
    assert [s for s, _ in ck.local.held()] == [12]  # step 12's only copy, still there
    choose.load(snap, trust)  # and it verifies


def test_a_preemption_at_a_saved_step_waits_for_its_promotion(
    tmp_path, signer, trust, prov, paused
):
    arm, there, release = paused
    ck = checkpointer(tmp_path, signer, trust, prov, final=12)
    state = tiny_state()
    ck.restore(state, "latest")
    arm("promote-write-6")
    train_steps(state, 1)
    ck.save(state, 6)  # an own loop's save; its promotion pauses
    there()

    def fail_it() -> None:
        threading.Event().wait(0.3)  # while maybe_save is (or should be) waiting for it
        _plant(ck.run_dir, 6)
        release()

    threading.Thread(target=fail_it).start()
    ck.preemption.join("SIGUSR1")
    with pytest.raises(UnsafePathError):  # not "checkpointed step 6" (Preempted)
        ck.maybe_save(state, 6)
    ck.close()


def test_a_promotion_refuses_its_temp_directory_swapped_while_it_copies(
    tmp_path, signer, trust, prov, paused
):
    release = paused[2]
    ck = _promoting(tmp_path, signer, trust, prov, paused, "promote-write-6", 6)
    tmp = _temp(ck.run_dir, 6)
    elsewhere = tmp_path / "elsewhere"
    tmp.rename(elsewhere)
    tmp.mkdir()  # someone else's directory under the temp name
    release()
    # refused by the check before a file or before the commit (a copy thread that had
    # passed its check as the name was swapped fails on the missing subdirectory instead)
    with pytest.raises((UnsafePathError, CommitError)):
        ck.flush()
    assert scan(ck.run_dir).committed == []  # never published
    ck.close()


def test_local_directories_are_private_from_the_root_down(tmp_path, signer, trust, prov):
    old = os.umask(0o022)
    try:
        ck = checkpointer(tmp_path, signer, trust, prov)
        ck.restore(tiny_state(), "latest")
    finally:
        os.umask(old)
    ck.close()
    for path in (tmp_path / "shm", ck.local.dir.parent, ck.local.dir):
        st = os.lstat(path)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid(), path


def _refused(tmp_path, signer, trust, prov, error, match):
    ck = checkpointer(tmp_path, signer, trust, prov)
    with pytest.raises(error, match=match) as got:
        ck.restore(tiny_state(), "latest")
    ck.close()
    assert "\n" not in str(got.value) and str(got.value).startswith(f"{KEY}: ")
    assert not ck._restorer.locked
    return ck


def test_a_planted_link_on_the_way_is_refused_and_nothing_written_through_it(
    tmp_path, signer, trust, prov
):
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir(mode=0o700)
    run_dir = (tmp_path / "run").resolve()
    planted = rules.local_dir(tmp_path / "shm", run_dir, 0).parent
    planted.parent.mkdir(mode=0o700)
    planted.symlink_to(elsewhere)
    _refused(tmp_path, signer, trust, prov, UnsafePathError, "is a symlink")
    assert list(elsewhere.iterdir()) == []


def test_a_root_others_can_write_or_another_user_owns_is_refused(tmp_path, signer, trust, prov):
    root = tmp_path / "shm"
    root.mkdir()
    root.chmod(0o777)
    _refused(tmp_path, signer, trust, prov, UnsafePathError, "others can write it")
    if os.geteuid() == 0:  # only root can give a directory away
        root.chmod(0o700)
        os.chown(root, 65534, 65534)
        _refused(tmp_path, signer, trust, prov, UnsafePathError, "belongs to uid 65534")


def test_a_root_that_is_no_directory_is_one_storage_error_line(tmp_path, signer, trust, prov):
    (tmp_path / "shm").write_text("a file")
    _refused(tmp_path, signer, trust, prov, StorageError, "cannot keep the local tier")


def test_a_local_directory_swapped_after_it_was_made_is_refused(tmp_path):
    root, leaf = tmp_path / "root", tmp_path / "root" / "run-abc" / "rank0"
    held = PrivateDir(root, leaf, key=KEY)
    assert held.made == [root, leaf.parent, leaf]
    held.check()
    leaf.rename(tmp_path / "away")
    leaf.mkdir(mode=0o700)  # the same name, another directory
    with pytest.raises(UnsafePathError, match="no longer the directory this run made"):
        held.check()
    held.close()


def test_a_refused_start_leaves_no_directory_it_made(tmp_path, signer, trust, prov, monkeypatch):
    real = rules.shutil.disk_usage
    monkeypatch.setattr(rules.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    _refused(tmp_path, signer, trust, prov, StorageError, "needs")
    # the per-user root stays (another run of this user's may be making its directory in it)
    assert list((tmp_path / "shm").iterdir()) == []


@pytest.mark.parametrize(
    ("mode", "advice"),
    [
        (0o775, "If it is yours: chmod go-w {root}"),  # a umask of 002
        (0o1777, "Use a directory of your own inside it: " + KEY + "={root}/recovery-{{uid}}"),
    ],
)
def test_a_root_others_can_write_is_refused_with_the_fix_that_fits(tmp_path, mode, advice):
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(mode)
    with pytest.raises(UnsafePathError) as refused:
        PrivateDir(root, root / "run" / "rank0", key=KEY)
    message = str(refused.value)
    assert f"has mode {mode:o}" in message and advice.format(root=root) in message
    assert "\n" not in message and list(root.iterdir()) == []


def test_a_local_directory_removed_while_the_run_used_it_says_so(tmp_path):
    root, leaf = tmp_path / "root", tmp_path / "root" / "run" / "rank0"
    held = PrivateDir(root, leaf, key=KEY)
    leaf.rmdir()
    with pytest.raises(StorageError, match="was removed while the run used it"):
        held.check()
    held.close()


def test_the_ram_check_runs_again_with_the_first_snapshot_s_real_size(
    tmp_path, signer, trust, prov, monkeypatch
):
    """A fresh run's Adam state appears at its first step: the start-up estimate is short."""
    ck = checkpointer(tmp_path, signer, trust, prov, final=12)
    real = rules.shutil.disk_usage
    room = {"free": 1 << 40}
    monkeypatch.setattr(rules.shutil, "disk_usage", lambda p: real(p)._replace(free=room["free"]))
    state = tiny_state(width=256)
    ck.restore(state, "latest")
    (started,) = [r for r in read(ck.run_dir / "metrics.jsonl") if r.get("event") == "local_tier"]
    room["free"] = rules.HELD * started["snapshot_bytes"]  # what the estimate needed
    train_steps(state, 1)
    ck.maybe_save(state, 1)
    train_steps(state, 1)
    ck.maybe_save(state, 2)  # the first snapshot, with the optimizer's moments
    assert ck.local.snapshot_bytes > 1.5 * started["snapshot_bytes"]
    train_steps(state, 1)
    ck.maybe_save(state, 3)
    train_steps(state, 1)
    with pytest.raises(StorageError, match=rf"^{KEY}: the local tier in .* needs") as got:
        ck.maybe_save(state, 4)  # refused before a second snapshot is written
    assert "\n" not in str(got.value)
    assert [s for s, _ in ck.local.held()] == [2]
    ck.close()


@pytest.mark.parametrize(
    ("free", "ram", "held", "staging", "room"),
    [
        (100, None, 10, 50, 110),  # not in RAM: the root's free space, staging elsewhere
        (100, 1000, 10, 50, 110),  # a tmpfs smaller than the memory available
        (1000, 100, 10, 50, 60),  # memory is shorter than the tmpfs's size limit
        (1000, 10, 0, 50, 0),
    ],
)
def test_the_room_for_snapshots_is_bounded_by_memory_when_the_root_is_in_ram(
    free, ram, held, staging, room
):
    assert rules.available(free, ram, held, staging) == room


def test_which_filesystem_and_how_much_memory():
    mounts = "/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\nx /dev/shm/a\\040b ext4 rw 0 0\n"
    assert rules.mounted_type(Path("/dev/shm/recovery-0"), mounts) == "tmpfs"
    assert rules.mounted_type(Path("/dev/shmx"), mounts) == "ext4"
    assert rules.mounted_type(Path("/dev/shm/a b/c"), mounts) == "ext4"
    assert rules.mem_available("MemTotal: 8 kB\nMemAvailable:    2048 kB\n") == 2 << 20
    assert rules.mem_available("MemTotal: 8 kB\n") is None


def test_a_local_snapshot_copied_into_the_run_directory_is_never_a_persistent_checkpoint(
    tmp_path, signer, trust, prov, caplog
):
    ck, _ = crash_at(tmp_path, signer, trust, prov, 8)
    (snap,) = [p for _, p in ck.local.held()]
    copy = ck.run_dir / step_dir_name(8)
    shutil.move(snap, copy)  # its name now a persistent checkpoint's
    again = checkpointer(tmp_path, signer, trust, prov, final=12)
    assert again.restore(tiny_state(), "latest") == 6  # not the copy
    assert "is a local-tier snapshot" in caplog.text
    # retention neither counts it (step 6 would go) nor deletes it; DVC passes it over
    assert retention.retain(ck.run_dir, 8, keep_last=1, keep_every=0, trust=trust) == []
    assert copy.is_dir() and tracking.local_snapshot(copy)
    assert not tracking.local_snapshot(ck.run_dir / step_dir_name(6))
    again.close()


def test_a_resumed_snapshot_whose_promotion_had_committed_counts_as_persistent(
    tmp_path, signer, trust, prov
):
    """Killed between a promotion's commit and the close that removes the snapshots: the
    run resumed from that snapshot (RAM first) ends with its local directory removed."""
    ck, _ = crash_at(tmp_path, signer, trust, prov, 8)
    kept = shutil.copytree(ck.local.dir.parent, tmp_path / "kept")
    again = checkpointer(tmp_path, signer, trust, prov, final=12)
    assert again.restore(tiny_state(), "latest") == 8
    again.close()  # step 8 promoted, then the local directory removed
    assert [s for s, _ in scan(ck.run_dir).committed] == [6, 8]
    shutil.copytree(kept, ck.local.dir.parent)  # as if the process died before the removal
    third = checkpointer(tmp_path, signer, trust, prov, final=12)
    assert third.restore(tiny_state(), "latest") == 8
    third.close()
    assert not third.local.dir.exists()


def test_a_local_snapshot_copied_into_the_run_directory_does_not_make_its_step_persistent(
    tmp_path, signer, trust, prov
):
    """The copy has the snapshot's root digest (the root covers the files), but it says
    ``tier: local``: resuming from the snapshot must not count step 8 persistent, else the
    close removes the one copy a later resume would take."""
    ck, _ = crash_at(tmp_path, signer, trust, prov, 8)
    (snap,) = [p for _, p in ck.local.held()]
    shutil.copytree(snap, ck.run_dir / step_dir_name(8))
    again = checkpointer(tmp_path, signer, trust, prov, final=12)
    assert again.restore(tiny_state(), "latest") == 8
    again.close()
    third = checkpointer(tmp_path, signer, trust, prov, final=12)
    assert third.restore(tiny_state(), "latest") == 8
    third.close()


CGROUP_FILES = {
    "job/memory.max": "1000\n",  # cgroup v2: the job's limit
    "job/memory.current": "400\n",
    "job/step/memory.max": "max\n",  # no limit of its own
    "job/step/memory.current": "300\n",
    "memory/slurm/memory.limit_in_bytes": "5000\n",  # v1
    "memory/slurm/memory.usage_in_bytes": "4500\n",
}


@pytest.mark.parametrize(
    ("cgroups", "room"),
    [
        ("0::/job/step\n", 600),  # the parent's limit holds its child
        ("0::/\n", None),  # no limit file at the root: none
        ("4:memory:/slurm\n0::/job\n", 500),  # v1 and v2 both: the least room
        ("3:cpu,cpuacct:/slurm\n", None),  # no memory controller
        ("", None),
    ],
)
def test_a_jobs_memory_limit_bounds_the_room_in_ram(cgroups, room):
    assert rules.cgroup_room(cgroups, CGROUP_FILES.get) == room


def test_a_deleted_run_does_not_come_back_from_ram(tmp_path, signer, trust, prov, caplog):
    # a killed run leaves its snapshot of step 8 in RAM; its run directory is deleted and a
    # new run starts at the same path with +resume=latest: it starts fresh, saying why
    ck, _ = crash_at(tmp_path, signer, trust, prov, 8)
    assert [s for s, _ in ck.local.held()] == [8]
    shutil.rmtree(ck.run_dir)
    again = checkpointer(tmp_path, signer, trust, prov, final=12)
    assert again.restore(tiny_state(), "latest") == 0
    again.close()
    said = [r.getMessage() for r in caplog.records if "stale local-tier snapshot" in r.getMessage()]
    assert len(said) == 1 and "the run directory was deleted or started anew" in said[0]
    starts = [r for r in read(again.run_dir / "metrics.jsonl") if r.get("event") == "start"]
    assert len(starts) == 1 and starts[0]["run_id"] != ck.run_id


def test_a_link_planted_as_a_newer_snapshot_is_refused_at_start(tmp_path, signer, trust, prov):
    ck, _ = crash_at(tmp_path, signer, trust, prov, 8)
    elsewhere = tmp_path / "theirs" / step_dir_name(10)
    shutil.copytree(ck.local.dir / step_dir_name(8), elsewhere)
    (ck.local.dir / step_dir_name(10)).symlink_to(elsewhere)
    again = checkpointer(tmp_path, signer, trust, prov, final=12)
    with pytest.raises(UnsafePathError, match="holds symlinks, which the local tier never writes"):
        again.restore(tiny_state(), "latest")
    again.close()
    assert not again._restorer.locked and (elsewhere / "model.sig").exists()  # nothing touched
