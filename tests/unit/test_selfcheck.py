"""recovery.run.restoring.selfcheck: the comparison of redone steps (table tests), the watcher."""

from __future__ import annotations

import math

import pytest

from recovery.config import ResumeCheckConfig
from recovery.errors import ConfigError, InexactResumeError
from recovery.run.journal import Journal, read, steps_after
from recovery.run.restoring import selfcheck
from recovery.run.restoring.selfcheck import ResumeCheck, compare, same


@pytest.mark.parametrize(
    ("a", "b", "rtol", "atol", "equal"),
    [
        (0.1, 0.1, 0, 0, True),
        (0.1, math.nextafter(0.1, 1), 0, 0, False),  # one ulp apart: not bit-identical
        (0.1, math.nextafter(0.1, 1), 1e-12, 0, True),
        (1.0, 1.1, 0, 0.2, True),
        (1.0, 1.3, 0, 0.2, False),
        (float("nan"), float("nan"), 0, 0, True),
        (float("inf"), float("inf"), 0, 0, True),
        (3, 3.0, 0, 0, True),
        (True, 1, 0, 0, True),  # not numbers to the comparison: == decides
        ([1, 2, 3], [1, 2, 3], 0, 0, True),
        ([1, 2, 3], [1, 2], 0, 0, False),
        ([0.5, [1.0]], [0.5, [1.0 + 1e-9]], 1e-6, 0, True),
        ({"a": 1.0}, {"a": 1.0}, 0, 0, True),
        ({"a": 1.0}, {"b": 1.0}, 0, 0, False),
        ("0a1b", "0a1b", 0, 0, True),
        ("0a1b", "0a1c", 0, 0, False),
    ],
)
def test_same(a, b, rtol, atol, equal):
    assert same(a, b, rtol=rtol, atol=atol) is equal


@pytest.mark.parametrize(
    ("expected", "found", "ignore", "diff"),
    [
        ({"step": 3, "loss": 1.0}, {"step": 3, "loss": 1.0}, (), None),
        ({"step": 3, "loss": 1.0}, {"step": 3, "loss": 2.0}, (), ("loss", 1.0, 2.0)),
        # the batch first: a data-order mistake is named as such, whatever else differs
        ({"loss": 1.0, "batch": "a", "lr": 1}, {"loss": 2.0, "batch": "b", "lr": 2}, (),
         ("batch", "a", "b")),
        # then the loss, then the rest by name
        ({"zeta": 1, "loss": 1.0, "alpha": 1}, {"zeta": 2, "loss": 1.0, "alpha": 2}, (),
         ("alpha", 1, 2)),
        # a field only one side recorded is not compared
        ({"loss": 1.0, "update": 0.3}, {"loss": 1.0}, (), None),
        ({"loss": 1.0, "time": 0.3}, {"loss": 1.0, "time": 0.9}, ("time",), None),
        # old journals kept the ids themselves: lists compare as lists
        ({"batch": [1, 2]}, {"batch": [1, 3]}, (), ("batch", [1, 2], [1, 3])),
    ],
)  # fmt: skip
def test_compare(expected, found, ignore, diff):
    assert compare(expected, found, ignore=frozenset(ignore)) == diff


def records(losses: dict[int, float]) -> dict[int, dict]:
    return {s: {"step": s, "loss": v} for s, v in losses.items()}


def test_redone_steps_equal_are_counted_and_summarised_at_the_last_one(tmp_path, caplog):
    journal = Journal(tmp_path / "m.jsonl")
    check = ResumeCheck(
        records({4: 0.4, 5: 0.5, 6: 0.6, 7: 0.7}), resumed_at=5, cfg=ResumeCheckConfig(),
        journal=journal,
    )  # fmt: skip
    journal.watch(check)
    with caplog.at_level("INFO"):
        for step, loss in ((6, 0.6), (7, 0.7), (8, 0.8)):
            journal.step(step, loss=loss)
    events = [r for r in read(tmp_path / "m.jsonl") if r.get("event")]
    assert events == [
        {"event": "resume_check", "status": "exact", "resumed_at": 5, "redone": [6, 7],
         "compared": 2, "identical": 2, "summary": True},
    ]  # fmt: skip
    assert "resume check: 2 redone steps bit-identical" in caplog.text
    assert check not in journal._watchers  # done: later steps cost nothing


def test_the_first_difference_is_loud_and_journaled_then_counted(tmp_path, caplog):
    journal = Journal(tmp_path / "m.jsonl")
    check = ResumeCheck(
        records({6: 0.6, 7: 0.7, 8: 0.8}), resumed_at=5, cfg=ResumeCheckConfig(), journal=journal
    )
    journal.watch(check)
    for step, loss in ((6, 0.6), (7, 0.75), (8, 0.85)):
        journal.step(step, loss=loss)
    first, summary = [r for r in read(tmp_path / "m.jsonl") if r.get("event")]
    assert first["status"] == "inexact" and first["first"] == {
        "step": 7, "field": "loss", "expected": 0.7, "found": 0.75
    }  # fmt: skip
    assert (summary["compared"], summary["identical"], summary["status"]) == (3, 1, "inexact")
    warning = next(r for r in caplog.records if "INEXACT RESUME at step 7" in r.message)
    assert warning.levelname == "WARNING" and "Likely:" in warning.message
    assert "0.7 (0x1.6666666666666p-1)" in warning.message  # both numbers, to the bit


def test_strict_raises_at_the_first_difference(tmp_path):
    journal = Journal(tmp_path / "m.jsonl")
    cfg = ResumeCheckConfig(strict=True)
    journal.watch(ResumeCheck(records({6: 0.6, 7: 0.7}), resumed_at=5, cfg=cfg, journal=journal))
    journal.step(6, loss=0.6)
    with pytest.raises(InexactResumeError) as err:
        journal.step(7, loss=0.71)
    assert (err.value.step, err.value.field) == (7, "loss")
    assert "checkpoint.resume_check.strict" in str(err.value)


def test_a_tolerance_accepts_small_differences_and_says_so(tmp_path):
    journal = Journal(tmp_path / "m.jsonl")
    cfg = ResumeCheckConfig(rtol=1e-3)
    check = ResumeCheck(records({6: 1.0}), resumed_at=5, cfg=cfg, journal=journal)
    journal.watch(check)
    journal.step(6, loss=1.0005)
    assert check.status == "exact"
    assert "within tolerance" in check.describe()
    assert read(tmp_path / "m.jsonl")[-1]["tolerance"] == {"rtol": 1e-3, "atol": 0.0}


def test_a_run_that_ends_before_its_last_redone_step_says_how_far_it_got(tmp_path):
    journal = Journal(tmp_path / "m.jsonl")
    check = ResumeCheck(
        records({6: 0.6, 7: 0.7, 8: 0.8}), resumed_at=5, cfg=ResumeCheckConfig(), journal=journal
    )
    journal.watch(check)
    journal.step(6, loss=0.6)
    check.finish()
    check.finish()  # once
    summaries = [r for r in read(tmp_path / "m.jsonl") if r.get("event")]
    assert [(s["compared"], s["redone"]) for s in summaries] == [(1, [6, 8])]


def test_nothing_to_redo_writes_nothing(tmp_path):
    journal = Journal(tmp_path / "m.jsonl")
    check = ResumeCheck(records({5: 0.5}), resumed_at=5, cfg=ResumeCheckConfig(), journal=journal)
    check.finish()
    assert check.done and not (tmp_path / "m.jsonl").exists()


def test_a_resume_compares_with_the_last_record_of_each_step_after_its_checkpoint(tmp_path):
    j = Journal(tmp_path / "m.jsonl")
    for rec in [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0}, {"event": "resume", "step": 1},
                {"step": 2, "loss": 2.5}, {"event": "checkpoint", "step": 2}]:  # fmt: skip
        j.write(rec)
    j.close()
    assert steps_after(tmp_path / "m.jsonl", 0) == {
        1: {"step": 1, "loss": 1.0},
        2: {"step": 2, "loss": 2.5},
    }
    assert steps_after(tmp_path / "m.jsonl", 1) == {2: {"step": 2, "loss": 2.5}}


def test_skipped_event():
    event = selfcheck.skipped(30, "resharded onto another world size")
    assert event["status"] == "skipped" and event["resumed_at"] == 30


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rtol": -1.0}, "rtol/atol: must be >= 0"),
        ({"ignore": [1]}, "ignore: expected a list of field names"),
    ],
)
def test_config_refuses(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ResumeCheckConfig(**kwargs)


def test_the_report_shows_each_resumes_self_check():
    from recovery.tools.report.run import story

    st = story(
        [{"event": "start", "run_id": "r"}, {"step": 1}, {"step": 2}, {"step": 3},
         {"event": "resume", "run_id": "r", "step": 1, "from": "run/step-00000001"},
         {"event": "resume_check", "status": "inexact", "resumed_at": 1,
          "first": {"step": 2, "field": "loss", "expected": 1.0, "found": 2.0}},
         {"event": "resume_check", "status": "inexact", "resumed_at": 1, "compared": 2,
          "identical": 0, "first": {"step": 2, "field": "loss"}, "summary": True},
         {"step": 2}, {"step": 3},
         {"event": "resume", "run_id": "r", "step": 2, "from": "run/step-00000002"},
         {"event": "resume_check", "status": "exact", "resumed_at": 2, "compared": 1,
          "identical": 1, "summary": True}]
    )  # fmt: skip
    assert [r.checked for r in st.resumes] == [
        "INEXACT at step 2 (loss); 0 of 2 identical",
        "1 of 1 redone steps bit-identical",
    ]


@pytest.mark.parametrize(
    ("field", "drift", "likely"),
    [
        ("lr", [], "Likely: the learning rate differs: a scheduler stepped after the save"),
        (
            "lr",
            ["config: train.steps: 200 -> 400"],
            "Likely: what changed since the checkpoint (DRIFT: config: train.steps: 200 -> "
            "400). Otherwise: the learning rate differs",
        ),
        (
            "loss",
            ["a", "b", "c", "d"],
            "Likely: what changed since the checkpoint (DRIFT: a; b; c; ...). Otherwise: loop",
        ),
    ],
)
def test_a_difference_names_the_drift_it_knows_before_the_loop(field, drift, likely):
    line = selfcheck.Difference(7, field, 0.1, 0.2).describe(5, drift)
    assert line.startswith("INEXACT RESUME at step 7 (resumed from step 5)") and likely in line


@pytest.mark.parametrize(
    ("resumed_at", "final", "reason"),
    [
        (40, 40, "nothing to compare: the run had finished"),
        (20, 40, "nothing to compare: no step was journaled after this checkpoint"),
    ],
)
def test_why_a_resume_has_nothing_to_compare(resumed_at, final, reason):
    assert selfcheck.nothing_redone(resumed_at, final) == reason
