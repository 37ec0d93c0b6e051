"""Whether a run's checkpoints can be registered with DVC at all: DVC refuses to write a
``.dvc`` file that git ignores, so a run directory whose ``.dvc`` files git ignores (this
repository's ``runs/``, say) is told so once, not failed at every checkpoint."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from recovery.storage.tracking import dvc_file


def git_ignored(root: Path, run_dir: Path) -> str | None:
    """Why git ignores the ``.dvc`` files of ``run_dir``'s checkpoints (``file:line:
    pattern``), or ``None``: DVC refuses to write a ``.dvc`` file that git ignores, so
    such a run cannot be registered. ``None`` too where git is absent or ``root`` is no
    git work tree (DVC then runs without git, and nothing is ignored)."""
    probe = os.path.relpath(os.path.abspath(dvc_file(run_dir / "step-00000000")), root)
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "check-ignore", "-v", "--", probe],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:  # 1: not ignored; 128: not a git work tree
        return None
    source = done.stdout.split("\t", 1)[0].strip()  # "<file>:<line>:<pattern>"
    if source.split(":", 2)[-1].startswith("!"):  # -v names a negation that matched last
        return None
    return source or "a git ignore rule"


def not_registered(run_dir: Path, why: str) -> str:
    """What a run whose ``.dvc`` files git ignores is told (:func:`git_ignored`)."""
    return (
        f"DVC: {run_dir} is not registered with DVC: git ignores its .dvc files ({why}), "
        "and DVC refuses a .dvc file git ignores. Use a run directory git does not ignore "
        "(checkpoint.root) to version its checkpoints, or set checkpoint.dvc.enabled=false"
    )
