"""``recovery --help``, ``--version``, ``ls RUN``, ``verify CKPT`` and ``audit CKPT`` answer
without importing torch (the speed itself is ``benchmarks/bench_cli_startup.py``'s, never a
timed test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from recovery.cli import helptext
from recovery.format.layout import step_dir_name
from tests.conftest import commit_state, tiny_state

RECOVERY = str(Path(sys.executable).with_name("recovery"))


def imported(argv: list[str], cwd: Path) -> set[str]:
    """The modules the console script imported running ``argv`` (``-X importtime``)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", RECOVERY, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return {
        line.split("|")[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["plan", "--help"], ["keygen", "-h"]])
def test_help_and_version_import_neither_torch_nor_any_command_but_their_own(tmp_path, argv):
    modules = imported(argv, tmp_path)
    assert "recovery.cli.main" in modules  # the measurement saw the CLI's imports
    assert "torch" not in modules and "numpy" not in modules
    own = (
        {f"recovery.cli.{helptext.COMMANDS[argv[0]].module}"}
        if argv[0] in helptext.COMMANDS
        else set()
    )
    shared = {"main", "codes", "common", "helptext", "overrides"}
    assert {m for m in modules if m.startswith("recovery.cli.")} <= own | {
        f"recovery.cli.{m}" for m in shared
    }


def test_ls_and_verify_of_a_real_run_verify_every_file_without_importing_torch(tmp_path, signer):
    run_dir = tmp_path / "checkpoints" / "run"
    commit_state(run_dir, tiny_state(), 4, signer)
    trusted = ["--trusted", str(signer.path.parent)]
    for argv in (
        ["ls", str(run_dir)],
        ["verify", str(run_dir / step_dir_name(4))],
        ["audit", str(run_dir / step_dir_name(4))],
    ):
        modules = imported([*argv, *trusted], tmp_path)
        assert "recovery.integrity.reads.hashonly" in modules  # it verified every file's digest
        assert "torch" not in modules and "numpy" not in modules, argv
