"""`recovery drill -- CMD` on a plain training loop (tests/fixtures/own_loop.py): it passes
when the loop resumes exactly, fails (23) when a piece of state is not restored, and
reports a loop that fails by itself as such."""

from __future__ import annotations

import json
import random
import sys

import pytest

from recovery import cli
from recovery.integrity.keys.trust import KEY_ENV
from recovery.tools import killpoints
from tests.integration.conftest import ROOT
from tests.integration.test_drill import assert_progress

pytestmark = pytest.mark.integration

LOOP = ROOT / "tests" / "fixtures" / "own_loop.py"
# the loop: 12 steps, checkpoints at 4, 8 and 12, keep_last=2 (12's commit retires 4)
COMMITS, RETIRES = [4, 8, 12], [(4, 12)]


def drill_args(tmp_path, *flags: str, extra: tuple[str, ...] = ()) -> list[str]:
    out = str(tmp_path / "drill")
    command = [sys.executable, str(LOOP), "--run-dir", "{run_dir}", *extra]
    return ["drill", "--out", out, "--json", *flags, "--", *command]


@pytest.fixture(autouse=True)
def _env(monkeypatch, signer):
    monkeypatch.setenv(KEY_ENV, str(signer.path))  # the loop signs, the CLI trusts, this key
    monkeypatch.delenv("RECOVERY_DRILL_DROP", raising=False)


def seed_killing_at_8() -> int:
    """A seed whose one kill is in the commit of 8: the resume then restores 4's state
    (a kill in 4's commit would leave nothing to restore, and nothing to drop)."""
    return next(
        s
        for s in range(100)
        if killpoints.choose_observed(
            random.Random(s), steps=12, commits=COMMITS, retires=RETIRES, kills=1
        )[0].endswith("-8")
    )


@pytest.mark.key
def test_drill_of_a_plain_loop_passes_with_kills_in_commits_retention_and_between_steps(
    tmp_path, capsys
):
    code = cli.main(drill_args(tmp_path, "--kills", "5", "--seed", "0"))
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout is the JSON alone: progress is on stderr
    assert code == 0, report["differences"]
    assert report["passed"] and report["level"] == "bitwise" and report["steps"] == 12
    reached = [k["point"] for k in report["kills"] if k["reached"]]
    assert len(reached) == 5 and all(k["exit"] == -9 for k in report["kills"])
    assert_progress(captured.err, reached)
    for kind in ("commit-write-", "commit-before-manifest-", "commit-before-rename-"):
        assert any(p.startswith(kind) for p in reached), kind
    assert "retire-4@12" in reached and any(p.startswith("step-") for p in reached)
    assert len(report["resumes"]) >= 3  # each kill but those in 4's commit left one to resume
    assert (tmp_path / "drill" / "drill.json").exists()


def test_drill_of_a_plain_loop_fails_when_its_data_position_is_not_restored(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("RECOVERY_DRILL_DROP", "sampler")
    code = cli.main(drill_args(tmp_path, "--kills", "1", "--seed", str(seed_killing_at_8())))
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 23 and not report["passed"] and report["error"]["name"] == "DrillError"
    assert report["resumes"] == [4]
    assert report["differences"][0] == "step 5: batch differs"
    assert any(d.startswith("final model/") for d in report["differences"])
    assert "drill failed" in captured.err


def test_a_loop_that_fails_on_resume_is_a_failed_command_not_a_difference(tmp_path, capsys):
    flags = ("--kills", "1", "--seed", str(seed_killing_at_8()))
    code = cli.main(drill_args(tmp_path, *flags, extra=("--fail-on-resume",)))
    err = capsys.readouterr().err
    assert code == 1
    assert "the victim's last run of" in err and "after 1 kill)" in err
    assert "own_loop: refusing to resume at step 4" in err.split("its stderr ends:")[1]
    assert "drill failed" not in err and not (tmp_path / "drill" / "drill.json").exists()
