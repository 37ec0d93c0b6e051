"""``recovery report`` of real killed-and-resumed runs, rendered by a real headless Chromium.

The own loop (tests/fixtures/own_loop.py) is SIGKILLed at a fault point and rerun, so it
resumes; its report is opened from disk by Debian's ``chromium`` (no sandbox, no GPU, no
background networking): the screenshot must not be blank and the page the browser built
must name the checkpoint the run resumed from. Where no browser is installed the test
skips and says why (``make test`` installs it where it can). The report of a 2-rank job
resumed on one process (its world sizes, the resharded resume) is checked in
test_distributed.py, on the run that test resumes.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from html import unescape
from pathlib import Path

import pytest

from recovery import cli
from recovery.integrity.keys.trust import KEY_ENV
from tests import launcher, system
from tests.integration.conftest import run_killed_at

pytestmark = pytest.mark.integration
import matplotlib  # noqa: E402,F401  (make test installs the plot extra: a missing one fails)

ROOT = Path(__file__).resolve().parents[2]
LOOP = ROOT / "tests" / "fixtures" / "own_loop.py"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def own_loop(run_dir: Path, signer, *, pause_at: str | None = None) -> int:
    """Run the own loop (20 steps, a checkpoint every 4); SIGKILL it at ``pause_at``."""
    env = {**os.environ, KEY_ENV: str(signer.path)}
    cmd = [sys.executable, str(LOOP), "--run-dir", str(run_dir), "--steps", "20"]
    code, out = run_killed_at(cmd, env=env, cwd=run_dir.parent, pause_at=pause_at)
    assert code == (-9 if pause_at else 0), out
    return code


def browser() -> str:
    system.require(system.CHROMIUM)  # else: the report was built but not rendered
    return next(found for b in system.CHROMIUM.programs if (found := shutil.which(b)))


def render(page: Path, shot: Path, size: str = "1400,2600") -> str:
    """Screenshot ``page`` into ``shot``; return the DOM the browser built from it."""
    exe = browser()
    url = page.resolve().as_uri()
    profile = page.parent / "chromium-profile"  # its own profile: no state from elsewhere
    common = [exe, *FLAGS, f"--user-data-dir={profile}", "--hide-scrollbars"]
    done = launcher.run([*common, f"--window-size={size}", f"--screenshot={shot}", url],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    dom = launcher.run([*common, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom.stdout


def test_the_report_of_a_killed_and_resumed_run_renders_in_chromium(tmp_path, signer, capsys):
    run_dir = tmp_path / "run"
    own_loop(run_dir, signer, pause_at="step-10")  # checkpoints 4 and 8 committed
    own_loop(run_dir, signer)  # resumes from step 8, redoes 9 and 10, ends at 20
    page = tmp_path / "report.html"
    trusted = ["--trusted", str(signer.path.parent)]
    assert cli.main(["report", str(run_dir), "--out", str(page), *trusted]) == 0
    capsys.readouterr()

    shot = tmp_path / "report.png"
    dom = render(page, shot)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))[..., :3]
    assert pixels.shape[0] > 1000 and pixels.shape[1] == 1400
    assert float(pixels.std()) > 0.05, "the screenshot is blank"
    inked = (pixels.mean(axis=2) < 0.9).mean()
    assert inked > 0.03, f"only {inked:.1%} of the screenshot is not white"
    text = re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", dom)))
    assert "resumed from step-00000008" in text  # the chart's label, as the browser has it
    assert re.search(r"\b8 step-00000008 " + re.escape(str(run_dir / "step-00000008")), text)
    assert "ended without a summary" in text and "9-10" in text
    assert "<svg" in dom and dom.count("<svg") >= 3  # curves, timeline, lineage
    if os.environ.get("RECOVERY_REPORT_SHOT"):  # to refresh docs/report.png by hand
        shutil.copy(shot, os.environ["RECOVERY_REPORT_SHOT"])
