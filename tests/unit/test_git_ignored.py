"""recovery.storage.gitignored.git_ignored: whether git ignores a run's .dvc files, read from
a real git work tree (a negation that matches last is no ignore)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from recovery.storage import gitignored

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.mark.parametrize(
    ("rules", "run", "ignored"),
    [
        ("", "runs/a", None),
        ("/runs/\n", "runs/a", ".gitignore:1:/runs/"),
        # this repository's rules: everything under checkpoints/ but the .dvc files
        ("/checkpoints/**\n!/checkpoints/**/\n!/checkpoints/**/*.dvc\n", "checkpoints/a", None),
        ("*.dvc\n", "checkpoints/a", ".gitignore:1:*.dvc"),
    ],
)
def test_a_run_whose_dvc_files_git_ignores_is_named_with_the_rule(tmp_path, rules, run, ignored):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text(rules)
    (tmp_path / run).mkdir(parents=True)
    assert gitignored.git_ignored(tmp_path, tmp_path / run) == ignored


def test_outside_a_git_work_tree_nothing_is_ignored(tmp_path: Path):
    assert gitignored.git_ignored(tmp_path, tmp_path / "runs" / "a") is None
