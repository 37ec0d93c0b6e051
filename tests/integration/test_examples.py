"""The real loop shapes in examples/ (a GPT-style loop with prefetch and accumulation, a
recurrent bptt loop): each passes a drill, and runs on the core install, killed and
resumed with its self-check saying the redone steps were bit-identical."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from recovery import cli
from recovery.format.layout import METRICS_FILE
from recovery.integrity.keys.trust import KEY_ENV
from recovery.run.journal import read
from tests.integration.conftest import ROOT, run_killed_at
from tests.integration.test_plain_loop import BLOCK

pytestmark = pytest.mark.integration

EXAMPLES = ["gpt_loop", "bptt_loop"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_example_passes_a_drill_with_four_kills(tmp_path, name, signer, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, str(signer.path))
    monkeypatch.delenv("RECOVERY_DRILL_DROP", raising=False)
    script = ROOT / "examples" / f"{name}.py"
    args = ["drill", "--out", str(tmp_path / "drill"), "--json", "--kills", "4", "--seed", "0"]
    code = cli.main([*args, "--", sys.executable, str(script), "--run-dir", "{run_dir}"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["differences"]
    assert report["passed"] and report["level"] == "bitwise"
    assert sum(k["reached"] for k in report["kills"]) == 4


@pytest.mark.parametrize("name", EXAMPLES)
def test_on_the_core_install_a_killed_run_resumes_and_says_it_is_exact(tmp_path, name):
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-c", BLOCK, str(ROOT / "examples" / f"{name}.py"), "--run-dir",
           str(run_dir)]  # fmt: skip
    code, out = run_killed_at(cmd, env=env, cwd=tmp_path, pause_at="step-15", profile="core")
    assert code == -signal.SIGKILL, out
    code, out = run_killed_at(cmd, env=env, cwd=tmp_path, pause_at=None, profile="core")
    assert code == 0, out
    assert "resume check: 5 redone steps bit-identical with the run that died" in out
    checks = [r for r in read(run_dir / METRICS_FILE) if r.get("event") == "resume_check"]
    assert [(c["status"], c["redone"]) for c in checks] == [("exact", [11, 15])]
