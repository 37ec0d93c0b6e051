"""Secrets never leave the process: by key, and by value wherever the value reached."""

from pathlib import Path

import pytest

from recovery.provenance.capture import REDACTED, redact, redact_overrides, secret_values

CONFIG = {
    "db": {"password": "hunter2-pw", "url": "postgresql://app:hunter2-pw@db:5432/x"},
    "api_key": "k-123456",
    "passcode": "123",  # shorter than MIN_SECRET_LEN: redacted under its key only
    "note": "id 123 and k-123456",
}


def test_secret_values_are_the_strings_under_secret_keys():
    assert secret_values(CONFIG) == {"hunter2-pw", "k-123456"}


def test_redact_masks_secret_values_that_reached_other_keys():
    out, keys = redact(CONFIG)
    assert out["db"]["password"] == out["api_key"] == out["passcode"] == REDACTED
    assert out["db"]["url"] == f"postgresql://app:{REDACTED}@db:5432/x"
    assert out["note"] == f"id 123 and {REDACTED}"
    assert sorted(keys) == ["api_key", "db.password", "db.url", "note", "passcode"]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+db.password=hunter2-pw", f"+db.password={REDACTED}"),
        ("+db.url=postgresql://app:hunter2-pw@db", f"+db.url=postgresql://app:{REDACTED}@db"),
        ("train.steps=5", "train.steps=5"),
        (
            "+db.url=postgresql://app:${db.password}@db",
            "+db.url=postgresql://app:${db.password}@db",
        ),
    ],
)
def test_overrides_are_redacted_by_key_and_by_value(override, expected):
    assert redact_overrides([override], {"hunter2-pw"}) == [expected]


def test_dvc_bookkeeping_is_not_a_change_of_code(tmp_path):
    # `make demo` (dvc repro) rewrites the tracked dvc.lock: later runs are not "dirty" for it
    import subprocess

    from recovery.provenance.capture import code_revision

    def git(*args):
        subprocess.run(
            ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
            cwd=tmp_path, check=True, capture_output=True,
        )  # fmt: skip

    (tmp_path / "dvc.lock").write_text("a\n")
    (tmp_path / "data.dvc").write_text("a\n")
    (tmp_path / "train.py").write_text("a\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    (tmp_path / "dvc.lock").write_text("b\n")
    (tmp_path / "data.dvc").write_text("b\n")
    assert code_revision(tmp_path)["dirty"] is False
    (tmp_path / "train.py").write_text("b\n")
    assert code_revision(tmp_path)["dirty"] is True


def test_the_dependency_lock_reads_the_same_names_as_the_metadata_parser(tmp_path):
    """The fast header read records exactly what the e-mail parser would: a resume of a
    checkpoint captured either way sees no dependency drift."""
    import importlib.metadata

    from recovery.provenance.dependencies import dependency_lock

    slow = sorted(
        {
            f"{(d.metadata['Name'] or '?').lower().replace('_', '-')}=={d.version}"
            for d in importlib.metadata.distributions()
        }
    )
    assert dependency_lock(tmp_path)["packages"] == slow
    assert any(name.startswith("torch==") for name in slow)


@pytest.mark.parametrize(
    ("status", "modified", "outdated", "unknown"),
    [
        ({}, False, [], False),
        ({"prepare": [{"changed outs": {"data/x": "not in cache"}}]}, False, [], True),
        ({"prepare": [{"changed outs": {"data/x": "modified"}}]}, True, [], False),
        ({"prepare": [{"changed outs": {"data/x": "deleted"}}]}, True, [], False),
        ({"prepare": [{"changed outs": {"data/other": "modified"}}]}, False, [], False),
        (
            {"prepare": [{"changed deps": {"recipes/prepare.py": "modified"}},
                         {"changed outs": {"data/x": "not in cache"}}]},
            False,
            ["recipes/prepare.py"],
            True,
        ),
        ({"prepare": ["changed command"]}, False, ["cmd"], False),
        ({"x.dvc": ["changed checksum"]}, False, ["checksum"], False),
        ({"x.dvc": [{"changed outs": {"x": "modified"}}]}, True, [], False),
        ({"prepare": ["always changed"]}, False, [], False),
    ],
)  # fmt: skip
def test_a_dataset_is_modified_only_when_its_data_differs(status, modified, outdated, unknown):
    """DVC's status of a stage mixes its dependencies and its outputs: a changed dependency
    is a stage out of date, not modified data; "not in cache" compares nothing (the caller
    compares the workspace). The shapes are DVC 3.67's (``dvc/stage/__init__.py``)."""
    from recovery.storage.dvc_status import status_of

    got = status_of(status, {"data/x", "x"})
    assert (got.modified, got.outdated, got.unknown) == (modified, outdated, unknown)


def test_the_committed_dvc_lock_is_current():
    """dvc.lock records the md5 of each dependency of `prepare` as the repository holds it
    (DVC hashes a file's bytes): a stale lock makes every fresh clone's stage out of date."""
    import hashlib

    import yaml

    root = Path(__file__).resolve().parents[2]
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    for stage in lock["stages"].values():
        for dep in stage["deps"]:
            path = root / dep["path"]
            if path.is_file():
                assert hashlib.md5(path.read_bytes()).hexdigest() == dep["md5"], (
                    f"dvc.lock is stale for {dep['path']}: run `dvc commit -f prepare` "
                    "(or `dvc repro prepare`) and commit dvc.lock"
                )
