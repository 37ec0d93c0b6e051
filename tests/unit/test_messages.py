"""Messages that name their cause: an error of several lines printed as one, a mismatch
error listing every mismatch, config keys that are no drift, the schedule on resume."""

from __future__ import annotations

import pytest
import torch

from recipes import schedule
from recipes.common import warmup_cosine
from recovery.provenance import capture
from recovery.provenance.drift import config_change, drift
from recovery.run.exits import one_line
from recovery.state.registry import does_not_fit


@pytest.mark.parametrize(
    ("message", "line"),
    [
        ("one line", "one line"),
        ("x does not fit (2):\n  a\n  b\nResume it.", "x does not fit (2): a; b. Resume it."),
        (
            "refusing; 1 differences:\n  code\nRestore it",
            "refusing; 1 differences: code. Restore it",
        ),
        ("first.\nsecond", "first. second"),
        ("", ""),
    ],
)
def test_a_message_of_several_lines_is_one(message, line):
    assert one_line(message) == line


@pytest.mark.parametrize(
    ("problems", "text"),
    [
        (["sampler.seed: checkpoint 1, this run 2"], "x does not fit this run (1 mismatch): "
         "sampler.seed: checkpoint 1, this run 2"),
        (["a", "b"], "x does not fit this run (2 mismatches): a; b"),
    ],
)  # fmt: skip
def test_a_mismatch_error_lists_every_mismatch_on_its_line(problems, text):
    assert does_not_fit("x", problems) == text


@pytest.mark.parametrize(
    ("old", "new", "drifts"),
    [
        (
            {"checkpoint": {"dvc": {"enabled": False}}},
            {"checkpoint": {"dvc": {"enabled": True}}},
            [],
        ),
        ({"checkpoint": {"dvc": {"push": False}}}, {"checkpoint": {"dvc": {"push": True}}}, []),
        ({"resume": "latest"}, {}, []),
        (
            {"checkpoint": {"every_steps": 10}},
            {"checkpoint": {"every_steps": 20}},
            ["config: checkpoint.every_steps: 10 -> 20"],
        ),
        ({"train": {"steps": 200}}, {"train": {"steps": 400}}, ["config: train.steps: 200 -> 400"]),
    ],
)
def test_where_checkpoints_are_also_kept_is_no_drift(old, new, drifts):
    assert drift({}, {}, old_config=old, new_config=new) == drifts


def test_a_train_steps_change_on_resume_says_what_the_schedule_does():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    short = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(100, 200, 0.05))
    for _ in range(200):
        opt.step()
        short.step()
    restored = opt.param_groups[0]["lr"]
    longer = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(100, 400, 0.05))
    longer.load_state_dict(short.state_dict())  # what a resume restores: the step
    opt.param_groups[0]["lr"] = restored
    line = schedule.change(["config: train.steps: 200 -> 400"], longer, opt, 200)
    assert line is not None and line.startswith(
        "train.steps changed on resume (200 -> 400): the learning-rate schedule is recomputed "
        "for 400 steps: step 201 trains at 0.0005 (the 200-step schedule's, restored), step "
        "202 at 0.00758"
    )
    assert schedule.change(["config: seed: 0 -> 1"], longer, opt, 200) is None
    assert "recomputed for 400 steps. With" in str(
        schedule.change(["config: train.steps: 200 -> 400"], None, None, 200)
    )


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ({"runtime": {"threads": 4}}, {"runtime": {"threads": 1}}, ["torch threads: 4 -> 1"]),
        ({"runtime": {"threads": 1}}, {"runtime": {"threads": 1}}, []),
        ({"runtime": {}}, {"runtime": {"threads": 1}}, []),  # recorded before it was
    ],
)
def test_a_resume_on_another_thread_count_is_drift(old, new, said):
    lines = drift(old, new)
    assert [line.split(" (")[0] for line in lines] == said


def test_the_thread_count_is_captured_when_torch_is_loaded(tmp_path):
    assert capture.capture(config={}, project_root=tmp_path)["runtime"]["threads"] == (
        torch.get_num_threads()
    )


@pytest.mark.parametrize(
    ("lines", "key", "change"),
    [
        (["config: train.steps: 200 -> 400"], "train.steps", (200, 400)),
        (["config: run.name: 'a' -> 'b'"], "run.name", ("a", "b")),
        (["config: train.steps: 200 -> 400"], "train", None),
        (["dataset: md5:x -> md5:y"], "train.steps", None),
    ],
)
def test_a_config_change_is_read_back_from_the_drift_line(lines, key, change):
    assert config_change(lines, key) == change
    if key == "train.steps" and change:  # the line drift() writes for it
        assert drift({}, {}, old_config={"train": {"steps": 200}},
                     new_config={"train": {"steps": 400}}) == lines  # fmt: skip
