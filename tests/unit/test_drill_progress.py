"""The drill's progress: the estimate of the time left, the lines, the short default run."""

import io
import json
import random

import pytest

from recovery import progress
from recovery.cli.commands.drill import KILLS
from recovery.cli.main import build_parser
from recovery.tools import drill, killpoints
from recovery.tools.drill.pace import Pace, describe, run_steps
from recovery.tools.drill.runs import Ran


@pytest.mark.parametrize(
    ("samples", "todo", "left"),
    [
        ([], [10], None),  # nothing measured yet
        ([(120, 20.0)], [], 0.0),  # nothing left
        ([(0, 8.0), (120, 20.0)], [20, 40], 2 * 8.0 + 0.1 * 60),  # start-up + per step
        ([(0, 8.0), (120, 20.0), (60, 14.0)], [0], 8.0),  # on the line: exact
        ([(120, 12.0)], [60, 60], 12.0),  # one size: proportional to it
        ([(0, 5.0), (0, 7.0)], [10, 0], 12.0),  # only start-ups: a fixed cost per run
        ([(10, 9.0), (20, 7.0)], [15, 15], 16.0),  # longer was faster (noise): the mean
        ([(10, 1.0), (20, 10.0)], [30], 5.5 / 15 * 30),  # negative start-up: proportional
    ],
)
def test_the_time_left_is_a_start_up_and_a_cost_per_step_fitted_to_the_runs_so_far(
    samples, todo, left
):
    assert progress.estimate_left(samples, todo) == pytest.approx(left)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (14.4, "14 s"), (59.6, "1 min"), (70, "1 min 10 s"), (3725, "1 h 02 min")],
)
def test_durations_read_as_a_person_says_them(seconds, text):
    assert progress.duration_text(seconds) == text


@pytest.mark.parametrize(
    ("point", "words"),
    [
        ("step-62", "between checkpoints"),
        ("commit-write-80", "during the save of step 80: writing its tensors"),
        ("commit-before-manifest-60", "during the save of step 60: before its signature"),
        ("commit-before-rename-60", "during the save of step 60: signed, before its rename"),
        ("retire-40@100", "while retention deletes step 40, in the save of step 100"),
        ("abandon-40@from-20", "a branch from step 20, moving step 40 aside"),
        ("best-copy-10", "while copying step 10 as the best"),
        ("dvc-push-70", "while DVC pushes step 70"),
        ("dvc-register-70", "while DVC registers step 70"),
    ],
)
def test_each_kind_of_kill_point_is_told_in_words(point, words):
    assert describe(point) == words


def test_each_run_is_sized_by_the_steps_it_trains_from_its_resume_to_its_kill():
    commits = [20, 40, 60, 80, 100, 120]
    points = [
        "commit-before-manifest-60",  # 0 -> 60, resumes at 40
        "abandon-40@from-20",  # a branch started at 20, killed before it trains
        "commit-before-rename-60",  # 20 -> 60, resumes at 40
        "step-62",  # 40 -> 62, resumes at 60
        "retire-40@100",  # 60 -> 100, resumes at 100 (after its rename)
    ]
    assert run_steps(points, commits, 120) == [60, 0, 40, 22, 40, 20]
    assert run_steps([], commits, 120) == [120]


def test_pace_says_each_run_in_order_with_the_time_left_until_the_comparison(tmp_path):
    said: list[tuple[str, int]] = []
    pace = Pace(lambda text, *, advance, left: said.append((text, advance)))
    journal = tmp_path / "metrics.jsonl"
    pace.plan(["commit-write-20", "step-30"], [20, 40], 40)
    pace.start(40)

    def run(hit: str, first_step_after: float) -> Ran:
        with journal.open("a") as fh:
            record = {"event": "first_step", "seconds_since_process_start": first_step_after}
            fh.write(json.dumps(record) + "\n")
        return Ran(0 if not hit else -9, hit, "")

    pace.timed(journal, lambda: run("", 0.0))
    pace.reference(40)
    pace.timed(journal, lambda: run("commit-write", 0.0))
    pace.victim("commit-write-20", Ran(-9, "commit-write", ""))
    pace.timed(journal, lambda: run("", 0.0))
    pace.victim("step-30", Ran(0, "", ""))  # ended by itself: only the last resume is left
    pace.timed(journal, lambda: run("", 0.0))
    pace.last()
    texts = [t for t, _ in said]
    assert texts[0] == "drill: reference run of 40 steps started"
    assert texts[1].startswith("drill: reference run 1/1 done in 0 s [est. 0 s left]")
    assert texts[2].startswith(
        "drill: kill 1/2 at step 20 (during the save of step 20: writing its tensors; "
        "commit-write-20) after 0 s [est."
    )
    assert (
        texts[3] == "drill: run 2/2 ended by itself before step-30 (never reached) [est. 0 s left]"
    )
    assert texts[4:] == [
        "drill: last resume ran to the end in 0 s",
        "drill: comparing every step and the final tensors",
    ]
    assert [a for _, a in said] == [0, 1, 1, 1, 1, 0]


def test_a_run_that_fails_by_itself_is_told_without_an_estimate(tmp_path):
    said: list[str] = []
    pace = Pace(lambda text, *, advance, left: said.append(text))
    pace.plan(["step-5", "step-7"], [4, 8], 8)
    pace.timed(tmp_path / "none.jsonl", lambda: Ran(0, "", ""))
    pace.reference(8)
    pace.timed(tmp_path / "none.jsonl", lambda: Ran(1, "", "boom"))
    pace.victim("step-5", Ran(1, "", "boom"))
    assert said[-1] == "drill: run 1/2 failed by itself (exit 1) before step-5"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_lines_are_plain_off_a_terminal_and_above_a_bar_on_one(monkeypatch, capsys):
    with progress.event_lines(2, "drill") as lines:
        lines.say("drill: one", advance=1, left="5 s")
    assert capsys.readouterr() == ("", "drill: one\n")
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    with progress.event_lines(2, "drill") as lines:
        lines.say("drill: one", advance=1, left="5 s")
        lines.say("drill: two", advance=1)
    shown = terminal.getvalue()
    assert "drill: one\n" in shown and "drill: two\n" in shown
    assert "| 00:00, est. 5 s left" in shown and "2/2" in shown
    assert shown.rstrip().rsplit("\r", 1)[-1].startswith("drill: 2/2 ")
    assert "left" not in shown.rsplit("drill: 2/2", 1)[1]  # no estimate: none was given


@pytest.mark.parametrize(
    ("overrides", "run"),
    [
        ([], ["train.steps=120", "checkpoint.every_steps=20"]),
        (
            ["recipe=classifier"],
            ["train.steps=120", "checkpoint.every_steps=20", "recipe=classifier"],
        ),
        (["train.steps=60"], ["train.steps=60"]),
        (["+checkpoint.every_steps=5"], ["+checkpoint.every_steps=5"]),
    ],
)
def test_the_drill_runs_short_unless_its_length_or_interval_is_given(overrides, run):
    assert drill.short_run(overrides) == run


@pytest.mark.parametrize("seed", range(8))
def test_the_default_drill_kills_in_every_phase_of_a_save_and_between_checkpoints(seed):
    steps, every = (int(o.split("=")[1]) for o in drill.SHORT_RUN)
    points = killpoints.choose_points(random.Random(seed), steps=steps, every=every, kills=KILLS)
    kinds = {p.split("@")[0].rsplit("-", 1)[0] for p in points}
    assert len(points) == KILLS
    assert kinds == {
        "commit-write",
        "commit-before-manifest",
        "commit-before-rename",
        "retire",
        "abandon",
        "step",
    }


def test_every_argument_of_the_drill_has_help_text():
    parser = build_parser(["drill"])
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    actions = commands.choices["drill"]._actions
    assert {a.dest for a in actions} >= {"kills", "seed", "out", "script", "timeout", "dvc"}
    assert [a.dest for a in actions if not (a.help or "").strip()] == []
