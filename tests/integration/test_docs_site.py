"""The documentation site as a reader sees it: built, opened in a real headless Chromium at
a laptop's width, no code block runs past the right edge of its column (long lines wrap:
docs/stylesheets/extra.css). The browser lays the page out; a script added to a copy of
each page reports every ``pre > code`` whose content is wider than its box."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import launcher, system

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# the pages with the widest blocks: log lines, long commands, config tables in code
PAGES = ["own-loop", "train", "cli", "dvc", "experiments", "tiers"]
PROBE = """<script>
window.addEventListener("load", () => {
  const wide = [...document.querySelectorAll("pre > code")]
    .filter((c) => c.scrollWidth > c.clientWidth + 1)
    .map((c) => c.textContent.split("\\n").sort((a, b) => b.length - a.length)[0].slice(0, 80));
  document.body.setAttribute("data-wide", JSON.stringify(wide));
  document.body.setAttribute("data-blocks", document.querySelectorAll("pre > code").length);
});
</script>"""


def test_no_code_block_of_the_site_runs_past_its_column(tmp_path):
    system.require(system.CHROMIUM)
    browser = next(found for b in system.CHROMIUM.programs if (found := shutil.which(b)))
    site = tmp_path / "site"
    built = launcher.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    for page in PAGES:
        original = site / page / "index.html"
        probed = original.with_name("probed.html")  # beside it: its relative links hold
        probed.write_text(original.read_text().replace("</body>", PROBE + "</body>"))
        dom = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--disable-background-networking", f"--user-data-dir={tmp_path / 'profile'}",
             "--window-size=1280,900", "--virtual-time-budget=3000", "--dump-dom",
             probed.as_uri()],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert dom.returncode == 0, dom.stderr[-2000:]
        blocks = re.search(r'data-blocks="(\d+)"', dom.stdout)
        wide = re.search(r"data-wide=\"([^\"]*)\"", dom.stdout)
        assert blocks and wide, f"{page}: the probe did not run"
        assert int(blocks.group(1)) > 0, f"{page}: no code block laid out"
        found = json.loads(wide.group(1).replace("&quot;", '"').replace("&amp;", "&"))
        assert found == [], f"{page}: code blocks wider than their column: {found}"
