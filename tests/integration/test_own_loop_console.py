"""What a user's own loop prints about its resume with no logging set up: the README's loop,
SIGKILLed and run again, says on stderr that it resumed (run, step, checkpoint, tier, what
was verified, the signer) and what the self-check found; run once more it says the run is
finished. Under the application's own ``logging.basicConfig`` the package adds nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from recovery.integrity.keys.trust import KEY_ENV
from tests import launcher
from tests.integration.conftest import run_killed_at

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
LOOP = re.search(r"^## Your own loop\n.*?^```python\n(.*?)^```", README, re.S | re.M)
assert LOOP is not None
CONFIGURED = "import logging\nlogging.basicConfig()\n"


def run(script: Path, signer) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, KEY_ENV: str(signer.path)}
    return launcher.run(
        [sys.executable, str(script)],
        env=env,
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=180,
        profile="core",
    )


def killed_and_rerun(tmp_path: Path, signer, prefix: str = "", at: int = 25) -> str:
    """The loop killed after step ``at`` (its last checkpoint: 20), run again: its stderr."""
    script = tmp_path / "loop.py"
    script.write_text(prefix + LOOP.group(1))
    env = {**os.environ, KEY_ENV: str(signer.path)}
    code, out = run_killed_at(
        [sys.executable, str(script)], env=env, cwd=tmp_path, pause_at=f"step-{at}", profile="core"
    )
    assert code == -9, out
    again = run(script, signer)
    assert again.returncode == 0, again.stderr
    return again.stderr


def test_the_readme_loop_announces_its_resume_and_the_verdict(tmp_path, signer):
    err = killed_and_rerun(tmp_path, signer)
    lines = err.splitlines()
    resumed = next(line for line in lines if line.startswith("RESUMED"))
    assert re.fullmatch(
        r"RESUMED run [0-9a-f]{12} at step 20 from runs/quickstart/step-00000020 \(persistent "
        rf"tier; verified: signature and \d+ file digests, signed by {signer.key_id[:12]} "
        r"\(trusted\)\): restored model, optimizer, scheduler, sampler, health, rng",
        resumed,
    ), resumed
    verdict = "resume check: 5 redone steps bit-identical with the run that died (steps 21-25"
    assert any(line.startswith(verdict) for line in lines), err
    assert lines.index(resumed) < next(i for i, x in enumerate(lines) if x.startswith(verdict))

    finished = run(tmp_path / "loop.py", signer).stderr
    assert (
        "resume check from step 40: not compared (nothing to compare: the run had finished"
        in finished
    )
    assert (
        "the run is finished: it resumed at step 40, its final step (40); nothing to train"
        in finished
    )


def test_a_resume_with_no_step_to_redo_says_so(tmp_path, signer):
    err = killed_and_rerun(tmp_path, signer, at=20)  # killed once step 20 had committed
    assert "RESUMED run" in err and "at step 20" in err, err
    assert (
        "resume check from step 20: not compared (nothing to compare: no step was journaled "
        "after this checkpoint)"
    ) in err


def test_under_the_applications_logging_config_the_package_adds_nothing(tmp_path, signer):
    err = killed_and_rerun(tmp_path, signer, prefix=CONFIGURED)
    assert "RESUMED" not in err and "resume check" not in err, err
    # basicConfig's format and level (WARNING) alone: every line is one of its records
    for line in err.splitlines():
        assert re.match(r"(WARNING|ERROR|CRITICAL):recovery\.", line), err


def test_a_run_dir_git_ignores_is_not_registered_and_says_so_once(tmp_path, signer):
    # the README's loop in a git + DVC project whose .gitignore holds /runs/, as this one's
    env = {**os.environ, KEY_ENV: str(signer.path), "DVC_NO_ANALYTICS": "1"}
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env["PATH"]])
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=tmp_path, env=env, check=True, capture_output=True)
    (tmp_path / ".gitignore").write_text("/runs/\n")
    (tmp_path / "loop.py").write_text(LOOP.group(1))
    done = run(tmp_path / "loop.py", signer)
    assert done.returncode == 0, done.stderr
    notice = (
        "DVC: runs/quickstart is not registered with DVC: git ignores its .dvc files "
        "(.gitignore:1:/runs/), and DVC refuses a .dvc file git ignores."
    )
    assert done.stderr.count(notice) == 1, done.stderr
    assert "failed" not in done.stderr and "PosixPath" not in done.stderr, done.stderr
    sync = subprocess.run(
        ["recovery", "sync", "runs/quickstart"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sync.returncode == 21 and sync.stderr.startswith(f"error: {notice}"), sync.stderr
