"""recovery.run.restoring.certificate: each resume's verdict, as the signed lineage carries it."""

from __future__ import annotations

import pytest

from recovery.config import CheckpointConfig, ResumeCheckConfig
from recovery.format.layout import step_dir_name
from recovery.run.checkpointer import Checkpointer
from recovery.run.restoring import certificate, checked, selfcheck
from tests.conftest import tiny_state, train_steps

EXACT = {"status": "exact", "compared": 3, "identical": 3}
TOLERATED = {"status": "exact", "compared": 2, "identical": 2, "tolerance": {"rtol": 1e-6}}
INEXACT = {
    "status": "inexact",
    "compared": 3,
    "identical": 1,
    "first": {"step": 7, "field": "loss"},
}
SKIPPED = {"status": "skipped", "reason": "nothing to compare: the run had finished"}


def resume(at: int, check: dict | None) -> dict:
    return {"kind": "resume", "at_step": at, **({"check": check} if check else {})}


@pytest.mark.parametrize(
    ("checks", "tally"),
    [
        ([], "no resume"),
        ([EXACT], "1 resume, bit-identical"),
        ([EXACT, EXACT, EXACT], "3 resumes, each bit-identical"),
        ([SKIPPED], "1 resume, not compared"),
        ([None, None], "2 resumes, none with a signed verdict"),
        ([EXACT, TOLERATED], "2 resumes: 1 bit-identical, 1 within tolerance"),
        (
            [SKIPPED, INEXACT, EXACT, None],
            "4 resumes: 1 bit-identical, 1 INEXACT, 1 not compared, 1 no verdict",
        ),
    ],
)
def test_the_tally_counts_each_kind_of_verdict(checks, tally):
    lineage = [{"kind": "start"}, *(resume(5 * i, c) for i, c in enumerate(checks, 1))]
    lineage.append({"kind": "export"})
    assert certificate.tally(certificate.resumes(lineage)) == tally


@pytest.mark.parametrize(
    ("check", "line"),
    [
        (EXACT, "resume at step 5: 3 of 3 redone steps bit-identical"),
        (INEXACT, "resume at step 5: INEXACT at step 7 (loss); 1 of 3 identical"),
        (SKIPPED, "resume at step 5: not compared (nothing to compare: the run had finished)"),
        (None, "resume at step 5: no verdict"),
    ],
)
def test_one_line_per_resume(check, line):
    (found,) = certificate.resumes([resume(5, check)])
    assert certificate.line(found) == line


def _resumed_lineage(tmp_path, signer, trust, prov, **cfg):
    """A run checkpointed at 4 and closed there, resumed, run on to 8: the lineage of 8."""
    config = CheckpointConfig(every_steps=4, **cfg)
    kw = {"signer": signer, "trust": trust, "provenance": prov, "preemption": False}
    state = tiny_state()
    with Checkpointer(config, tmp_path / "run", final_step=8, **kw) as ck:
        ck.restore(state)
        for step in range(1, 5):
            loss = train_steps(state, 1)[0]
            ck.record(step, loss=loss)
            ck.maybe_save(state, step)
    state = tiny_state()
    with Checkpointer(config, tmp_path / "run", final_step=8, **kw) as ck:
        assert ck.restore(state, "latest") == 4
        for step in range(5, 9):
            ck.record(step, loss=train_steps(state, 1)[0])
            ck.maybe_save(state, step)
    done = checked.check(tmp_path / "run" / step_dir_name(8), trust)
    return certificate.resumes(done.manifest.recovery["lineage"])


@pytest.mark.parametrize(
    ("cfg", "reason"),
    [
        ({}, "nothing to compare: no step was journaled after this checkpoint"),
        ({"resume_check": ResumeCheckConfig(enabled=False)}, selfcheck.TURNED_OFF),
    ],
)
def test_a_resume_not_compared_signs_why_into_the_next_checkpoint(
    tmp_path, signer, trust, prov, cfg, reason
):
    (found,) = _resumed_lineage(tmp_path, signer, trust, prov, **cfg)
    assert found["at_step"] == 4
    assert found["check"] == {"status": "skipped", "reason": reason}
