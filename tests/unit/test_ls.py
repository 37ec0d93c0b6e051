"""``recovery ls``: a readable, headed table; a checkpoint that fails verification fails it.

The CLI runs as the console script, in a working directory whose default
trust store is empty (so only ``--trusted`` makes the test key trusted).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from recovery.format.layout import step_dir_name
from recovery.integrity.commits import commit
from recovery.state import snapshot
from recovery.storage import tracking
from tests import launcher
from tests.conftest import commit_state, tiny_state

RECOVERY = str(Path(sys.executable).parent / "recovery")
COLUMNS = ["step", "name", "purpose", "size", "verified", "signer", "status"]


def run_dir_with(tmp_path: Path, signer, steps=(2, 4)) -> Path:
    run_dir = tmp_path / "checkpoints" / "run"
    state = tiny_state()
    for step in steps:
        commit_state(run_dir, state, step, signer)
    return run_dir


def ls(tmp_path: Path, run_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return launcher.run(
        [RECOVERY, "ls", str(run_dir), *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def table(out: str) -> list[list[str]]:
    """The text table's cells (columns are separated by two or more spaces)."""
    return [re.split(r"\s{2,}", line.strip()) for line in out.strip().splitlines()]


def test_a_verified_run_is_a_headed_table_with_human_sizes(tmp_path, signer):
    run_dir = run_dir_with(tmp_path, signer)
    (run_dir / (step_dir_name(6) + ".tmp-abcdef")).mkdir()  # an interrupted write: no failure
    assert tracking.find_repo(run_dir) is None  # so no DVC column
    trusted = ["--trusted", str(signer.path.parent)]
    done = ls(tmp_path, run_dir, *trusted)
    assert done.returncode == 0, done.stderr
    rows = table(done.stdout)
    assert rows[0] == COLUMNS
    assert [r[0] for r in rows[1:]] == ["2", "4", "-"]
    for row in rows[1:3]:
        assert re.fullmatch(r"\d+\.\d KiB", row[3]), row
        assert row[4:] == ["yes", f"{signer.key_id[:12]} (trusted)", "ok"]
    assert rows[3][-1].startswith("partial")
    done = ls(tmp_path, run_dir, "--json", *trusted)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["dvc_in_use"] is False
    first = data["checkpoints"][0]
    assert {"step", "path", "purpose", "size", "verified", "status", "signer", "dvc"} <= set(first)
    assert first["status"] == "ok" and first["size"] > 1024 and isinstance(first["size"], int)


def test_a_damaged_checkpoint_fails_ls_with_the_first_failures_code(tmp_path, signer):
    run_dir = run_dir_with(tmp_path, signer, steps=(2, 4, 6))
    os.truncate(run_dir / step_dir_name(2) / "state.json", 3)  # exit 8
    model = run_dir / step_dir_name(4) / "model.safetensors"
    model.write_bytes(b"x" * model.stat().st_size)  # exit 9
    trusted = ["--trusted", str(signer.path.parent)]
    done = ls(tmp_path, run_dir, *trusted)
    assert done.returncode == 8, (done.stdout, done.stderr)
    rows = table(done.stdout)
    assert [r[-1] for r in rows[1:]] == [
        "DAMAGED: wrong size of state.json",
        "DAMAGED: sha256 mismatch in model.safetensors",
        "ok",
    ]
    assert "Error" not in done.stdout  # no exception class names in the table
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: 2 of 3 checkpoints failed verification; the first: "
    )
    assert str(run_dir / step_dir_name(2) / "state.json") in err[0]
    done = ls(tmp_path, run_dir, "--json", *trusted)
    assert done.returncode == 8
    rows = json.loads(done.stdout)["checkpoints"]
    assert [(r["status"], r.get("exit_code")) for r in rows] == [
        ("TruncatedFileError", 8),
        ("DigestMismatchError", 9),
        ("ok", None),
    ]
    assert rows[1]["summary"] == "DAMAGED: sha256 mismatch in model.safetensors"


def test_an_untrusted_signer_fails_ls_and_is_named_by_its_key_id(tmp_path, signer):
    run_dir = run_dir_with(tmp_path, signer, steps=(2,))
    done = ls(tmp_path, run_dir, "--json")
    assert done.returncode == 17, done.stderr
    (row,) = json.loads(done.stdout)["checkpoints"]
    assert row["key_id"] == signer.key_id and row["verified"] is False
    assert row["summary"] == f"UNTRUSTED key {signer.key_id[:12]}"
    done = ls(tmp_path, run_dir, "--allow-untrusted")
    assert done.returncode == 0, done.stderr
    assert table(done.stdout)[1][-2:] == [f"{signer.key_id[:12]} (UNTRUSTED)", "ok"]


def test_the_dvc_column_is_shown_when_the_root_is_in_a_dvc_repository(tmp_path, signer):
    run_dir = run_dir_with(tmp_path, signer, steps=(2,))
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("")
    done = ls(tmp_path, run_dir, "--trusted", str(signer.path.parent))
    assert done.returncode == 0, done.stderr
    rows = table(done.stdout)
    assert rows[0] == [*COLUMNS[:-1], "dvc", "status"]
    assert rows[1][-2:] == ["pending", "ok"]


def test_an_empty_run_says_it_holds_no_checkpoints_and_exits_3(tmp_path):
    run_dir = tmp_path / "checkpoints" / "run"
    run_dir.mkdir(parents=True)
    done = ls(tmp_path, run_dir)
    assert done.returncode == 3 and done.stdout == "", done
    assert done.stderr.startswith(f"error: {run_dir}: holds no checkpoints"), done.stderr
    done = ls(tmp_path, run_dir, "--json")
    assert done.returncode == 3
    error = json.loads(done.stdout)["error"]
    assert (error["code"], error["name"]) == (3, "CheckpointNotFoundError")
    assert "holds no checkpoints" in error["message"]


def test_a_step_directory_is_listed_as_its_own_row(tmp_path, signer):
    run_dir = run_dir_with(tmp_path, signer, steps=(2, 4))
    done = ls(tmp_path, run_dir / step_dir_name(4), "--trusted", str(signer.path.parent))
    assert done.returncode == 0, done.stderr
    rows = table(done.stdout)
    assert rows[0] == COLUMNS and len(rows) == 2
    assert rows[1][:2] == ["4", step_dir_name(4)] and rows[1][-1] == "ok"


def test_a_run_with_dvc_off_says_off_not_pending(tmp_path, signer):
    run_dir = tmp_path / "checkpoints" / "run"
    run_dir.mkdir(parents=True)
    config = "checkpoint:\n  dvc:\n    enabled: false\n"
    files = snapshot.encode(tiny_state().state_dict(), step=2, meta={}, config_yaml=config)
    statement = {"step": 2, "purpose": "continuation", "requires": []}
    commit.commit(run_dir / step_dir_name(2), files, statement, signer=signer)
    (tmp_path / ".dvc").mkdir()  # in a DVC repository: the column is shown
    (tmp_path / ".dvc" / "config").write_text("")
    done = ls(tmp_path, run_dir, "--trusted", str(signer.path.parent))
    assert done.returncode == 0, done.stderr
    assert table(done.stdout)[1][-2:] == ["off", "ok"]
