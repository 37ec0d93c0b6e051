"""The suite's preloaded launcher (tests/launcher/): its children behave as fresh
interpreters do where the tests look — pid, signals, exit status, argv, environment,
working directory, streams — and what it cannot run goes to a real fresh interpreter."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests import launcher

PY = sys.executable
RECOVERY = str(Path(PY).parent / "recovery")


def both(cmd: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, ...]:
    """The command run by a fresh interpreter and by the launcher."""
    fresh = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)
    forked = launcher.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)
    return fresh, forked


@pytest.mark.parametrize(
    "code",
    [
        "import sys; print(sys.argv[1:], __name__); sys.exit(3)",
        "raise ValueError('boom')",
        "import sys; sys.exit('a message')",
        "import sys; sys.exit(None)",
        "import sys; print('out'); print('err', file=sys.stderr); sys.exit(300)",
        "raise KeyboardInterrupt",
        "import threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('joined'))).start()",
        "import atexit; atexit.register(lambda: print('at exit'))",
        "open('written.txt', 'w').write('unflushed until collected')",
    ],
)
def test_a_forked_child_exits_and_prints_as_a_fresh_interpreter(tmp_path, code):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fresh = subprocess.run(
        [PY, "-c", code, "x"], capture_output=True, text=True, cwd=tmp_path / "a"
    )
    forked = launcher.run([PY, "-c", code, "x"], capture_output=True, text=True, cwd=tmp_path / "b")
    assert isinstance(forked, subprocess.CompletedProcess)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert forked.stderr == fresh.stderr
    for name in ("written.txt",):
        assert (tmp_path / "a" / name).exists() == (tmp_path / "b" / name).exists()
        if (tmp_path / "a" / name).exists():
            assert (tmp_path / "b" / name).read_text() == (tmp_path / "a" / name).read_text()


def test_argv_path_environment_and_working_directory_are_the_commands(tmp_path):
    script = tmp_path / "prog" / "show.py"
    script.parent.mkdir()
    script.write_text(
        "import json, os, sys\n"
        "print(json.dumps([sys.argv, sys.path[:2], os.getcwd(), os.environ.get('ITEM'),"
        " 'HOME' in os.environ, __name__, __file__]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HOME"}
    env.update(ITEM="seven", PYTHONPATH=str(tmp_path / "extra"))
    fresh, forked = both([PY, str(script), "--flag", "v"], env=env, cwd=tmp_path)
    assert forked.returncode == fresh.returncode == 0, forked.stderr
    assert forked.stdout == fresh.stdout


def test_a_console_script_runs_forked_and_answers_as_the_installed_one():
    fresh, forked = both([RECOVERY, "--version"])
    assert launcher.forkable([RECOVERY, "--version"])
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)


def test_a_real_sigkill_ends_the_child_and_its_status_says_so(tmp_path):
    proc = launcher.Popen(
        [PY, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert isinstance(proc, launcher.Forked)
    assert int(proc.stdout.readline()) == proc.pid != os.getpid()
    assert proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)  # the test's own signal, to the child's own pid
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.stdout.close()


def test_a_handled_sigterm_runs_the_childs_handler(tmp_path):
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
        "print('ready', flush=True); time.sleep(60)"
    )
    proc = launcher.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.terminate()
    assert proc.wait(timeout=30) == 143
    proc.stdout.close()


def test_wait_times_out_and_a_new_session_is_a_process_group_of_its_own():
    proc = launcher.Popen([PY, "-c", "import time; time.sleep(60)"], start_new_session=True)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    assert os.getpgid(proc.pid) == proc.pid
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_what_it_cannot_fork_goes_to_a_fresh_interpreter(tmp_path):
    assert not launcher.forkable([PY, "-m", "torch.utils.collect_env"])
    assert not launcher.forkable([PY, "-X", "importtime", "-c", "pass"])
    assert not launcher.forkable(["git", "--version"])
    # read as the libraries are imported: the preloaded server would not see it
    assert not launcher.forkable([PY, "-c", "pass"], {**os.environ, "MKL_NUM_THREADS": "3"})
    assert not launcher.forkable([PY, "-c", "pass"], {**os.environ, "TORCH_LOGS": "dynamo"})
    assert launcher.forkable([PY, "-c", "pass"], {**os.environ, "PYTHONPATH": "/x"})
    copy = tmp_path / "recovery"  # a directory of that name, not the project's package
    copy.mkdir()
    (tmp_path / "train.py").write_text("")
    assert not launcher.forkable([PY, str(tmp_path / "train.py")])
    assert not launcher.forkable([PY, "-c", "pass"], cwd=tmp_path)
    assert launcher.forkable([PY, "-c", "pass"], cwd=tmp_path / "recovery")
    done = launcher.run(["git", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("git version")


def test_the_core_profile_leaves_the_optional_dependencies_unimported():
    code = "import sys; print(sorted({m.split('.')[0] for m in sys.modules} & {'dvc', 'hydra'}))"
    core = launcher.run([PY, "-c", code], capture_output=True, text=True, profile="core")
    full = launcher.run([PY, "-c", code], capture_output=True, text=True)
    assert core.stdout.strip() == "[]"
    assert full.stdout.strip() == "['dvc', 'hydra']"


def test_stochastic_state_a_fresh_interpreter_seeds_from_the_os_differs_per_child():
    code = "import random, numpy; print(random.random(), numpy.random.rand())"
    seen = {launcher.run([PY, "-c", code], capture_output=True, text=True).stdout for _ in range(3)}
    assert len(seen) == 3


def test_a_drill_in_a_child_forks_its_runs_from_the_same_server(tmp_path):
    code = (
        "import os, sys\n"
        "from recovery.tools.drill import runs as drill_runs\n"
        "cmd = [sys.executable, '-c', 'import os, time; print(os.getppid()); time.sleep(60)']\n"
        "proc = drill_runs.subprocess.Popen(cmd, stdout=drill_runs.subprocess.PIPE, text=True)\n"
        "parent = int(proc.stdout.readline()); proc.kill()\n"
        "print(os.getppid() == parent, proc.wait())\n"
    )
    # the run's parent is the server (the drill's own parent), not a fresh interpreter's
    done = launcher.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", str(-signal.SIGKILL)]


LEVEL = (
    "import logging, sys\n"
    "from torch.distributed.elastic.agent.server import api\n"  # preloaded by the server
    "print(logging.getLevelName(api.logger.level), flush=True)\n"
    "sys.stdin.read()\n"
)


def test_loglevel_reaches_torchruns_loggers_and_a_record_keeps_a_childs_environment(tmp_path):
    """``LOGLEVEL``, which torchrun's modules apply to their loggers on import, is applied
    to those the server imported; a child given ``RECORD_ENV`` records the environment it
    runs with (its ``/proc`` one is its server's) while it lives."""
    env = {**os.environ, "LOGLEVEL": "INFO", launcher.RECORD_ENV: str(tmp_path), "MARK": "m"}
    assert launcher.forkable([PY, "-c", LEVEL], env)
    proc = launcher.Popen([PY, "-c", LEVEL], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"INFO"
    assert launcher.recorded(tmp_path)[proc.pid]["MARK"] == "m"
    assert "MARK" not in psutil.Process(proc.pid).environ()  # why the record
    proc.communicate(b"", timeout=60)
    assert proc.returncode == 0 and launcher.recorded(tmp_path) == {}  # gone: left out
    plain = launcher.run([PY, "-c", LEVEL], capture_output=True, text=True, input="")
    assert plain.stdout.strip() == "WARNING"  # torch's default, without LOGLEVEL


def test_resource_limits_are_set_in_the_child_as_a_preexec_fn_sets_them():
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_FSIZE))"
    limits = {resource.RLIMIT_FSIZE: (20_000, 20_000)}
    forked = launcher.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True, rlimits=limits)
    assert isinstance(forked, launcher.Forked)
    assert forked.communicate(timeout=60)[0].strip() == "(20000, 20000)"
    fresh = launcher.run(
        ["/bin/sh", "-c", "ulimit -f"], capture_output=True, text=True, rlimits=limits
    )
    assert fresh.stdout.strip() == str(20_000 // 512)  # the shell counts 512-byte blocks


SETPRIV = [
    "setpriv",
    *(f"--{o}=-dac_override,-dac_read_search" for o in ("bounding-set", "inh-caps")),
]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and util-linux's setpriv: it compares the capabilities setpriv leaves "
    "root with those of the forked child (CI runs as root, with setpriv)",
)
def test_a_setpriv_prefix_leaves_the_child_the_capabilities_the_execd_command_has(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("x")
    secret.chmod(0)
    code = (
        "print(''.join(ln for ln in open('/proc/self/status') if ln.startswith('Cap')))\n"
        f"open({str(secret)!r}).read()\n"
    )
    assert launcher.unsetpriv([*SETPRIV, PY, "-c", code]) == ([PY, "-c", code], [1, 2])
    assert launcher.unsetpriv(["setpriv", "--reuid=1", PY]) == (["setpriv", "--reuid=1", PY], [])
    fresh = subprocess.run([*SETPRIV, PY, "-c", code], capture_output=True, text=True)
    forked = launcher.run([*SETPRIV, PY, "-c", code], capture_output=True, text=True)
    assert "CapBnd" in fresh.stdout and forked.stdout == fresh.stdout  # every capability set
    assert fresh.returncode == forked.returncode == 1
    assert "PermissionError" in fresh.stderr and "PermissionError" in forked.stderr
    assert launcher.run([PY, "-c", code], capture_output=True).returncode == 0  # root's own


RANK = """
import os, sys, time, torch
print(os.environ["RANK"], os.getpid(), torch.get_num_threads(), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""


def test_a_torchrun_job_forks_its_ranks_into_the_agents_process_tree(tmp_path):
    """The agent is forked; its two ranks come from its zygote: in the job's process tree
    (a kill of the tree reaches them), with torchrun's OMP_NUM_THREADS=1 applied."""
    script, release = tmp_path / "rank.py", tmp_path / "release"
    script.write_text(RANK)
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert launcher.forkable(cmd)
    agent = launcher.Popen([*cmd, str(script), str(release)], stdout=subprocess.PIPE, text=True)
    assert isinstance(agent, launcher.Forked)
    ranks = sorted(agent.stdout.readline().split() for _ in range(2))
    tree = {p.pid for p in psutil.Process(agent.pid).children(recursive=True)}
    assert [(r, int(pid) in tree, threads) for r, pid, threads in ranks] == [
        ("0", True, "1"),
        ("1", True, "1"),
    ]
    release.touch()
    out, _ = agent.communicate(timeout=60)
    assert agent.returncode == 0, out


def test_killing_a_forked_torchrun_agent_ends_its_ranks(tmp_path):
    """The zygote kills the ranks it still runs when its agent is gone (SIGKILL)."""
    script = tmp_path / "rank.py"
    script.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(120)\n")
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    agent = launcher.Popen([*cmd, str(script)], stdout=subprocess.PIPE, text=True)
    pids = [int(agent.stdout.readline()) for _ in range(2)]
    agent.kill()
    assert agent.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
        assert time.monotonic() < deadline, f"ranks {pids} outlived their agent"
        time.sleep(0.05)
    agent.stdout.close()


def test_a_copy_of_the_project_runs_its_own_code_from_a_server_of_its_own(tmp_path):
    """A command that would import a copy's packages is forked from the copy's own server
    (its ``__file__`` paths and edits are the copy's), which ends with the test; one that
    would import a package from the copy and one from this checkout runs fresh."""
    copy = tmp_path / "proj"
    for name in ("recovery", "recipes"):
        shutil.copytree(
            launcher.ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    with open(copy / "recipes" / "__init__.py", "a") as fh:
        fh.write("\nEDITED_IN_THE_COPY = True\n")
    code = "import recovery, recipes; print(recovery.__file__, recipes.EDITED_IN_THE_COPY)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy's code only
    assert launcher.root_for([PY, "-c", code], env, cwd=copy) == copy
    done = launcher.run([PY, "-c", code], cwd=copy, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(copy / "recovery" / "__init__.py"), "True"]
    assert ("full", copy) in launcher._SERVERS
    mixed = {**env, "PYTHONPATH": str(launcher.ROOT)}
    # the copy first on the path: its packages shadow the checkout's, as they would fresh
    assert launcher.root_for([PY, "-c", code], mixed, cwd=copy) == copy
    shutil.rmtree(copy / "recipes")  # recipes from the checkout, recovery from the copy
    assert launcher.root_for([PY, "-c", code], mixed, cwd=copy) is None


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("python -m recipes.prepare", [PY, "-m", "recipes.prepare"]),
        ("python train.py train.steps=40 -Sseed=1", [PY, "train.py", "train.steps=40", "-Sseed=1"]),
        ("python train.py > log", None),  # a redirection: the shell's
        ("python train.py; recovery ls", None),
        ("python 'train.py'", None),  # quoting
        ("SEED=1 python train.py", None),  # an assignment
        ("python train.py ~/x", None),  # tilde expansion
        ("no-such-program-here x", None),
    ],
)
def test_a_stage_command_runs_without_its_shell_only_when_the_shell_would_do_nothing(command, argv):
    env = {**os.environ, "PATH": f"{Path(PY).parent}:{os.environ['PATH']}"}
    assert launcher.unshell(["/bin/bash", "--noprofile", "--norc", "-c", command], env) == argv
    assert launcher.unshell(["/usr/bin/fish", "-c", command], env) is None
