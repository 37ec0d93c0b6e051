"""An own loop at module level (no with-block) preempted by a real SIGTERM: with
``ckpt.exit_on_error()`` it checkpoints, closes (the async save flushed, the run's
summary journaled) and exits 75 with one line, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from recovery import faults
from recovery.format.layout import METRICS_FILE, scan
from recovery.integrity.keys.trust import KEY_ENV
from recovery.run.journal import read
from tests import launcher
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration


def test_a_module_level_loop_preempted_closes_and_exits_75(tmp_path):
    run_dir, mark, release = tmp_path / "run", tmp_path / "mark", tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    env.update({faults.PAUSE_ENV: "step-5", faults.MARK_ENV: str(mark),
                faults.RELEASE_ENV: str(release)})  # fmt: skip
    cmd = [sys.executable, str(ROOT / "tests" / "fixtures" / "module_loop.py"), str(run_dir)]
    proc = launcher.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)  # fmt: skip
    while not mark.exists():
        assert proc.poll() is None, proc.stdout.read()  # type: ignore[union-attr]
        time.sleep(0.02)  # not a busy loop: the other worker's tests share the cores
    os.kill(proc.pid, signal.SIGTERM)  # a real preemption signal, between steps
    release.touch()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, out
    assert "Traceback" not in out and "checkpointed step 6" in out
    assert [s for s, _ in scan(run_dir).committed] == [4, 6]
    events = [r.get("event") for r in read(run_dir / METRICS_FILE)]
    assert events[-2:] == ["preempted", "run_summary"]  # closed: the summary written last
