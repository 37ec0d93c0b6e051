"""The run's journal against the directory: rollback and substitution are found and said."""

import shutil

import pytest

from recovery.errors import ForeignCheckpointError, RollbackError
from recovery.format.layout import step_dir_name
from recovery.run.journal import read
from recovery.run.restoring import history
from recovery.run.restoring.history import History
from tests.unit.test_checkpointer import _keys, run  # noqa: F401 - _keys: an autouse fixture


@pytest.mark.parametrize(
    ("records", "run_id", "newest"),
    [
        ([], None, None),
        ([{"event": "start", "run_id": "a"}, {"event": "checkpoint", "step": 2}], "a", 2),
        (
            [
                {"event": "start", "run_id": "a"},
                *({"event": "checkpoint", "step": s} for s in (2, 4, 6)),
                {"event": "retired", "steps": [2, 6]},
            ],
            "a",
            4,
        ),
        (  # a step retired, then written again (a branch through it) is alive again
            [
                {"event": "checkpoint", "step": 4},
                {"event": "retired", "steps": [4]},
                {"event": "checkpoint", "step": 4},
            ],
            None,
            4,
        ),
        ([{"event": "start", "run_id": "a"}, {"event": "resume", "run_id": "b"}], "b", None),
        ([{"step": 3, "loss": 1.0}, {"event": "resume"}], None, None),
    ],
)
def test_history_from_records(records, run_id, newest):
    h = history.from_records(records)
    assert (h.run_id, h.newest) == (run_id, newest)


@pytest.mark.parametrize(
    ("newest", "step", "rolls_back"), [(None, 0, False), (6, 6, False), (6, 8, False), (6, 4, True)]
)
def test_rollback_is_resuming_older_than_the_newest_commit(newest, step, rolls_back):
    h = History(committed=frozenset({newest} if newest is not None else set()))
    assert (history.rollback(h, step) is not None) == rolls_back


def test_foreign_needs_a_known_run_id():
    assert not history.foreign(History(), "x")
    assert history.foreign(History(run_id="a"), "b") and not history.foreign(History("a"), "a")


def test_a_deleted_newest_checkpoint_is_a_loud_rollback_and_strict_refuses(tmp_path, caplog):
    run(tmp_path, 6, keep_last=3)  # checkpoints 2, 4, 6; keep all
    shutil.rmtree(tmp_path / "run" / step_dir_name(6))
    with pytest.raises(RollbackError, match="committed step 6"):
        run(tmp_path, 8, resume="latest", strict_resume=True)
    _, losses, ck = run(tmp_path, 8, resume="latest")
    assert ck.resumed_from.name == step_dir_name(4) and sorted(losses) == [5, 6, 7, 8]
    assert "ROLLBACK" in caplog.text and "committed step 6" in caplog.text


def test_retention_is_journaled_and_never_reads_as_a_rollback(tmp_path, caplog):
    run(tmp_path, 8, keep_last=2)  # 2 and 4 are deleted by retention
    retired = [r for r in read(tmp_path / "run" / "metrics.jsonl") if r.get("event") == "retired"]
    assert sorted(s for r in retired for s in r["steps"]) == [2, 4]
    _, _, ck = run(tmp_path, 10, resume="latest", strict_resume=True)
    assert ck.resumed_from.name == step_dir_name(8) and "ROLLBACK" not in caplog.text


def test_another_runs_checkpoint_is_never_adopted_by_latest(tmp_path, caplog):
    run(tmp_path, 4, keep_last=3)  # this run: 2, 4
    run(tmp_path / "other", 6, keep_last=3)  # another run, same signer
    planted = tmp_path / "run" / step_dir_name(6)
    shutil.copytree(tmp_path / "other" / "run" / step_dir_name(6), planted)

    _, losses, ck = run(tmp_path, 8, resume="latest")
    assert ck.resumed_from.name == step_dir_name(4) and sorted(losses) == [5, 6, 7, 8]
    assert "SUBSTITUTION" in caplog.text


def test_strict_refuses_a_planted_checkpoint_and_only_foreign_ones_refuse_a_fresh_start(
    tmp_path,
):
    run(tmp_path, 4, keep_last=3)
    run(tmp_path / "other", 6, keep_last=3)
    planted = tmp_path / "run" / step_dir_name(6)
    shutil.copytree(tmp_path / "other" / "run" / step_dir_name(6), planted)
    with pytest.raises(ForeignCheckpointError, match="was written by run"):
        run(tmp_path, 8, resume="latest", strict_resume=True)
    for step in (2, 4):
        shutil.rmtree(tmp_path / "run" / step_dir_name(step))
    with pytest.raises(ForeignCheckpointError, match="refusing to start fresh"):
        run(tmp_path, 8, resume="latest")


def test_another_runs_checkpoint_named_explicitly_is_continued_and_recorded(tmp_path):
    run(tmp_path, 4, keep_last=3)
    _, _, other = run(tmp_path / "other", 6, keep_last=3)
    source = tmp_path / "other" / "run" / step_dir_name(6)
    _, _, ck = run(tmp_path, 8, resume=str(source))
    assert ck.run_id == other.run_id
    (event,) = [r for r in read(tmp_path / "run" / "metrics.jsonl") if r.get("event") == "resume"]
    assert event["replaced_run"] != other.run_id and event["run_id"] == other.run_id


@pytest.mark.parametrize(
    ("records", "abandoned", "newest"),
    [
        (  # a branch at 4 abandoned 6 and 8: they are retired, and where they went is known
            [
                *({"event": "checkpoint", "step": s} for s in (4, 6, 8)),
                {
                    "event": "abandoned",
                    "steps": [6, 8],
                    "to": "abandoned/from-00000004-20261201T000000",
                },
            ],
            {
                6: "abandoned/from-00000004-20261201T000000",
                8: "abandoned/from-00000004-20261201T000000",
            },
            4,
        ),
        (  # the branch writes 6 again: that one is the run's, no longer abandoned
            [
                *({"event": "checkpoint", "step": s} for s in (4, 6, 8)),
                {
                    "event": "abandoned",
                    "steps": [6, 8],
                    "to": "abandoned/from-00000004-20261201T000000",
                },
                {"event": "checkpoint", "step": 6},
            ],
            {8: "abandoned/from-00000004-20261201T000000"},
            6,
        ),
        (  # the journal is not signed: a destination outside abandoned/ is never taken
            [
                {"event": "checkpoint", "step": 6},
                {"event": "abandoned", "steps": [6], "to": "../../elsewhere"},
            ],
            {},
            None,
        ),
    ],
)
def test_abandoned_branches_in_the_history(records, abandoned, newest):
    h = history.from_records(records)
    assert (h.abandoned, h.newest) == (abandoned, newest)
