"""recipes.outcome and the sweep's line per job: how a run went, in a few words."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.outcome import said
from recovery.cli.hydra_sweeper import job_line

RUN = Path("ck/r")


@pytest.mark.parametrize(
    ("started", "ended", "resumed", "warm", "line"),
    [
        (0, 60, False, False, "run ck/r: new, trained to step 60"),
        (0, 60, False, True, "run ck/r: new, warm-started, trained to step 60"),
        (30, 60, True, False, "run ck/r: resumed from step 30, trained to step 60"),
        (60, 60, True, False, "run ck/r: finished at step 60 before: nothing to train"),
    ],
)
def test_a_run_says_how_it_began_and_where_it_ended(started, ended, resumed, warm, line):
    assert said(RUN, started=started, ended=ended, final=60, resumed=resumed, warm=warm) == line


def test_a_jobs_line_masks_its_secrets_and_says_done_when_the_job_said_nothing():
    line = job_line(2, ["seed=1", "+db.password=hunter2"], None, {"hunter2"})
    assert line.startswith("#2 seed=1 +db.password=") and line.endswith(": done")
    assert "hunter2" not in line
