"""A full disk is one error (StorageError, exit 28, one message) whichever write met it and
whichever thread or moment surfaced it (the real-disk test: tests/integration/
test_storage_faults.py)."""

from __future__ import annotations

import errno
import os

import pytest

from recovery.errors import CommitError, StorageError
from recovery.exitcodes import exit_code
from recovery.integrity.commits import commit, full
from recovery.run.saving import retention
from tests.conftest import tiny_state, train_steps
from tests.unit.test_async import make


def no_space(code: int = errno.ENOSPC) -> OSError:
    return OSError(code, os.strerror(code))


def test_the_cause_is_found_anywhere_in_the_chain():
    try:
        try:
            raise no_space()
        except OSError as err:
            raise CommitError("could not commit") from err
    except CommitError as wrapped:
        assert full.cause(wrapped) is wrapped.__cause__
    try:
        try:
            raise no_space(errno.EDQUOT)
        except OSError:
            raise RuntimeError("while recording") from None
    except RuntimeError as hidden:  # `from None` keeps the context: still the cause
        assert full.cause(hidden) is not None
    assert full.cause(no_space(errno.EFBIG)) is not None
    assert full.cause(no_space(errno.EACCES)) is None
    assert full.cause(CommitError("no errno")) is None
    assert full.cause(None) is None


def test_the_error_names_the_run_directory_and_is_exit_28(tmp_path):
    err = full.refused(no_space(), tmp_path / "run")
    assert isinstance(err, StorageError) and exit_code(err) == 28
    text = str(err)
    assert text.startswith(f"{tmp_path / 'run'}: the disk is full (No space left on device)")
    assert "\n" not in text and "+resume=latest" in text


def fail_commit(*args, **kwargs):
    try:
        raise no_space()
    except OSError as err:  # as commit.commit wraps the write's error
        raise CommitError(f"could not commit checkpoint: {err}") from err


def fail_after_commit(*args, **kwargs):
    raise no_space()  # the journal record or retention after a commit that succeeded


@pytest.mark.parametrize(
    ("async_save", "where", "broken"),
    [
        (True, "next step", (commit, "commit", fail_commit)),
        (True, "close", (commit, "commit", fail_commit)),
        (True, "next step", (retention, "after_commit", fail_after_commit)),
        (False, "save", (commit, "commit", fail_commit)),
        (False, "save", (retention, "after_commit", fail_after_commit)),
    ],
)
def test_a_full_disk_surfaces_as_one_storage_error(
    tmp_path, signer, trust, prov, monkeypatch, async_save, where, broken
):
    ck, journal = make(tmp_path, signer, trust, prov, async_save=async_save, every_steps=2)
    state = tiny_state()
    ck.restore(state, None)
    monkeypatch.setattr(*broken)
    train_steps(state, 2)
    expected = str(full.refused(no_space(), tmp_path / "run"))
    try:
        if where == "save":
            with pytest.raises(StorageError) as err:
                ck.maybe_save(state, 2)
        else:
            ck.maybe_save(state, 2)
            ck._saves.strategy._writer._pending.exception(timeout=30)  # let it fail
            with pytest.raises(StorageError) as err:
                if where == "close":
                    ck.close()
                else:
                    train_steps(state, 1)
                    ck.maybe_save(state, 3)
        assert str(err.value) == expected and exit_code(err.value) == 28
    finally:
        ck.close()
        journal.close()
