import os
import shutil
import threading

import pytest

from recovery.errors import CommitError, StorageError
from recovery.format.layout import scan, step_dir_name
from recovery.integrity.commits import commit
from recovery.integrity.reads import reader
from tests.conftest import commit_state, tiny_state


def test_commit_leaves_only_the_final_dir(tmp_path, signer, trust):
    commit_state(tmp_path, tiny_state(), 5, signer)
    assert [p.name for p in tmp_path.iterdir()] == [step_dir_name(5)]
    reader.read_verified(tmp_path / step_dir_name(5), trust)


@pytest.mark.parametrize(
    ("errno", "message", "error"),
    [(5, "Input/output error", CommitError), (28, "No space left on device", StorageError)],
)
def test_failed_write_keeps_previous_and_leaves_no_temp(
    tmp_path, monkeypatch, signer, trust, errno, message, error
):
    commit_state(tmp_path, tiny_state(), 5, signer)
    before = {p.name: p.read_bytes() for p in (tmp_path / step_dir_name(5)).iterdir()}
    real = commit.write_file
    calls = []

    def failing(path, data, **kw):
        calls.append(path.name)
        if len(calls) == 2:
            raise OSError(errno, message)
        return real(path, data, **kw)

    monkeypatch.setattr(commit, "write_file", failing)
    with pytest.raises(error, match=f"{message}.*intact"):
        commit_state(tmp_path, tiny_state(), 10, signer)
    listing = scan(tmp_path)
    assert [s for s, _ in listing.committed] == [5] and listing.stale == []
    assert {p.name: p.read_bytes() for p in (tmp_path / step_dir_name(5)).iterdir()} == before


def test_recommit_same_step_replaces_atomically(tmp_path, signer, trust):
    commit_state(tmp_path, tiny_state(seed=0), 5, signer)
    (tmp_path / step_dir_name(5) / "model.safetensors").write_bytes(b"corrupt")
    commit_state(tmp_path, tiny_state(seed=1), 5, signer)
    reader.read_verified(tmp_path / step_dir_name(5), trust)
    assert scan(tmp_path).stale == []


def test_stale_temp_removed(tmp_path, caplog, signer, trust):
    commit_state(tmp_path, tiny_state(), 5, signer)
    stale = tmp_path / "step-00000010.tmp-abc123"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    removed = commit.remove_stale(tmp_path)
    assert removed == [stale] and not stale.exists()
    assert "interrupted checkpoint write" in caplog.text
    assert (tmp_path / step_dir_name(5)).is_dir()


def test_files_are_fsynced_and_hash_matches(tmp_path, signer, trust):
    rec = commit.write_file(tmp_path / "f", b"x" * (commit.CHUNK * 2 + 3))
    import hashlib

    assert rec.digest == hashlib.sha256(b"x" * (commit.CHUNK * 2 + 3)).hexdigest()
    assert rec.size == os.path.getsize(tmp_path / "f")


def test_an_aside_whose_step_is_gone_is_put_back_not_deleted(tmp_path, signer, trust):
    # a re-save killed between its renames (commit-aside-N): the old copy is aside, the
    # new one a temp dir; the start of the next writer must keep the old committed one
    commit_state(tmp_path, tiny_state(), 2, signer)
    final = tmp_path / step_dir_name(2)
    os.rename(final, tmp_path / f"{final.name}.aside-0123456789ab")
    (tmp_path / f"{final.name}.tmp-0123456789ab").mkdir()
    commit.remove_stale(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [final.name]
    assert reader.read_manifest(final, trust).step == 2


def test_an_aside_beside_its_committed_step_is_deleted(tmp_path, signer, trust):
    commit_state(tmp_path, tiny_state(), 2, signer)
    (tmp_path / f"{step_dir_name(2)}.aside-0123456789ab").mkdir()
    assert len(commit.remove_stale(tmp_path)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [step_dir_name(2)]


def test_discard_renames_before_deleting(tmp_path, signer, monkeypatch):
    commit_state(tmp_path, tiny_state(), 2, signer)
    final = tmp_path / step_dir_name(2)
    seen = []
    # the fault point is where a kill lands: by then no committed name is left
    monkeypatch.setattr(commit.faults, "reach", lambda p: seen.append((p, scan(tmp_path))))
    commit.discard(final, fault_point="retire-2")
    (point, listing) = seen[0]
    assert point == "retire-2" and listing.committed == [] and len(listing.stale) == 1
    assert list(tmp_path.iterdir()) == []


def test_discard_on_a_reaper_renames_at_once_and_deletes_on_its_thread(tmp_path, monkeypatch):
    from recovery.integrity.commits.reaping import Reaper

    victim = tmp_path / "step-00000001"
    victim.mkdir()
    (victim / "f").write_bytes(b"x" * 1000)
    gate = threading.Event()
    real = shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", lambda p, **kw: (gate.wait(5), real(p, **kw)))
    reaper = Reaper()
    commit.discard(victim, reaper=reaper)
    assert not victim.exists()  # renamed before discard returned: no reader takes it
    [trash] = list(tmp_path.iterdir())
    assert ".trash-" in trash.name and (trash / "f").exists()  # still being deleted
    gate.set()
    reaper.close()  # waits for every deletion handed over
    assert list(tmp_path.iterdir()) == []
