"""The demo leaves the README true: on a fresh clone, after the demo's steps, every command
the README shows works as written; ``git status`` shows only ``dvc.lock`` (this machine's
export) and the ``.dvc`` files of the README's own run, and ``dvc status`` is clean.

The README's commands are the ``$ `` lines of its ```console blocks, run in order from the
clone's root with the test's venv first on ``PATH`` and the clone's code on
``PYTHONPATH``; not run: ``$ make demo`` (the demo runs first, at quick sizes),
``$ make test``, ``$ make docs``, ``$ source .venv/bin/activate`` (the test's venv is
first on ``PATH``), and a line ending ``# not run: <reason>``. A line
ending ``# exits N`` must exit N, every other one 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# not run: the demo runs first, at quick sizes; the test's own venv is first on PATH
NOT_RUN = ("$ make demo", "$ make test", "$ make docs", "$ source .venv/bin/activate")
# the demo's quick mode: the same steps and commands, 12 training steps a run
QUICK = {"RECOVERY_DEMO_STEPS": "12"}
# what a run DVC tracks leaves for git, as the README asks (`git add` them): a checkpoint's
# .dvc file and DVC's .gitignore beside it
DVC_REGISTRATION = re.compile(r"\?\? checkpoints/[^/]+/(step-\d+\.dvc|\.gitignore)")


def console_commands(markdown: str) -> list[tuple[str, int]]:
    """The ``(command, expected exit code)`` of every ``$ `` line of ``markdown``'s
    ```console blocks, in order (a line ending in ``\\`` continues on the next)."""
    commands: list[tuple[str, int]] = []
    for block in re.findall(r"^```console\n(.*?)^```", markdown, flags=re.M | re.S):
        lines = iter(block.splitlines())
        for line in lines:
            if not line.startswith("$ ") or line.strip() in NOT_RUN:
                continue
            command = line[2:]
            while command.endswith("\\"):
                command = command[:-1] + next(lines, "")
            if re.search(r"#\s*not run: \S", command):
                continue
            code = re.search(r"#\s*exits (\d+)\s*$", command)
            commands.append((command, int(code.group(1)) if code else 0))
    return commands


def test_console_commands_are_read_as_the_readme_convention_says():
    text = "\n".join(
        [
            "```sh",
            "$ python skipped.py",
            "```",
            "```console",
            "$ make demo",
            "$ recovery ls checkpoints/default",
            "checkpoint table (output, not a command)",
            "$ python train.py run.name=a \\",
            "    train.steps=20",
            "$ python train.py   # exits 13",
            "$ dvc push   # not run: needs a remote",
            "```",
        ]
    )
    assert console_commands(text) == [
        ("recovery ls checkpoints/default", 0),
        ("python train.py run.name=a     train.steps=20", 0),
        ("python train.py   # exits 13", 13),
    ]


def git_status(repo: Path) -> list[str]:
    done = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def clone_env(clone: Path, tmp_path: Path) -> dict[str, str]:
    """The test's venv first on PATH (``python``, ``recovery``, ``dvc``), the clone's code
    first on PYTHONPATH (the editable install maps to this checkout), a per-user
    config directory and DVC's site cache of the test's own, none of the project's
    variables, and one torch thread a process (the runs are tiny, and on a busy machine
    torch's spinning pool triples their CPU time)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECOVERY_", "PYTHON"))}
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        PYTHONPATH=str(clone),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        DVC_SITE_CACHE_DIR=str(tmp_path / "dvc-site"),
        OMP_NUM_THREADS="1",
    )
    return env


def test_the_readmes_commands_work_after_the_demo_and_leave_only_what_they_say(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    commands = console_commands((clone / "README.md").read_text())
    assert len(commands) >= 3, f"the README shows {len(commands)} console commands: {commands}"
    env = clone_env(clone, tmp_path)
    where = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('recovery').origin)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(clone), "the clone's code does not run"

    # before anything is trained, `dvc repro` says what to train first, in one line of ours
    early = subprocess.run(
        ["dvc", "repro"], cwd=clone, env=env, capture_output=True, text=True, timeout=300
    )
    said = early.stdout + early.stderr
    assert early.returncode != 0 and "Errno" not in said, said
    assert "error: export: no verified checkpoint in checkpoints/default; train first" in said
    assert "starting a fresh run" not in said, said

    demo = subprocess.run(
        [sys.executable, "demo.py"],
        cwd=clone,
        env={**env, **QUICK},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stdout[-6000:] + demo.stderr[-6000:]
    assert "BIT-IDENTICAL" in demo.stdout, demo.stdout[-6000:]
    # dvc.lock records this machine's export (the README says so); nothing else changed
    assert git_status(clone) == [" M dvc.lock"], "the demo left files git sees"
    # the showcase tells no false story: no audit warning, relative paths to paste
    demo_said = demo.stdout + demo.stderr
    assert "audit: " not in demo_said and "deleted or moved by hand" not in demo_said
    assert str(clone) not in demo.stdout, "the demo printed an absolute path"
    status = subprocess.run(
        ["dvc", "status"], cwd=clone, env=env, capture_output=True, text=True, timeout=300
    )
    assert status.stdout.strip() == "Data and pipelines are up to date.", status.stdout

    for command, expected in commands:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == expected, (
            f"README: `{command}` exited {done.returncode}, expected {expected}:\n"
            + done.stdout[-3000:]
            + done.stderr[-3000:]
        )
    # the README's own training runs register their checkpoints with DVC, which leaves
    # the .dvc files the README says to commit; nothing else
    after = git_status(clone)
    left = [line for line in after if not DVC_REGISTRATION.fullmatch(line)]
    assert left == [" M dvc.lock"], "the README's commands left files git sees"
    # the README says the `mine` run is registered with DVC: its .dvc files are there to add
    assert any(line.startswith("?? checkpoints/mine/step-") for line in after), after
