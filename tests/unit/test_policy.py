import pytest

from recovery.config import parse_duration
from recovery.run.policy import (
    auto_interval,
    due,
    ignored_on_resume,
    is_better,
    plan,
    should_save,
    to_delete,
    young_daly,
)


@pytest.mark.parametrize(
    ("step", "every", "final", "last", "expected"),
    [
        (10, 10, 100, None, True),
        (15, 10, 100, None, False),
        (100, 10, 100, None, True),
        (95, 0, 95, None, True),  # every_steps=0: only the final one
        (90, 0, 95, None, False),
        (10, 10, 100, 10, False),  # the step just resumed at is not saved again
        (0, 10, 100, None, False),
        (7, 7, 7, 7, False),
    ],
)
def test_should_save(step, every, final, last, expected):
    assert should_save(step, every_steps=every, final_step=final, last_saved=last) is expected


@pytest.mark.parametrize(
    ("steps", "newest", "keep_last", "keep_every", "expected"),
    [
        ([10, 20, 30, 40], 40, 2, 0, [10, 20]),
        ([10, 20, 30, 40], 40, 3, 0, [10]),
        ([10, 20, 30, 40], 40, 10, 0, []),
        ([10, 20, 30, 40, 50], 50, 2, 20, [10, 30]),  # milestones 20, 40 kept forever
        ([10, 20], 20, 2, 0, []),
        # resumed from 20 while 30, 40 of an abandoned branch exist: window ends at newest
        ([10, 20, 30, 40], 20, 2, 0, []),
        ([5, 10, 20, 30, 40], 20, 2, 0, [5]),
        # the newest is never deleted, even if it is not a milestone and keep_last were 0
        ([10, 20, 30], 30, 0, 0, [10, 20]),
        # nothing is deleted unless the new one is committed (present in the listing)
        ([10, 20, 30], 40, 2, 0, []),
    ],
)
def test_to_delete(steps, newest, keep_last, keep_every, expected):
    assert to_delete(steps, newest=newest, keep_last=keep_last, keep_every=keep_every) == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("60", 60), ("90s", 90), ("5m", 300), ("24h", 86400), ("2d", 172800), (1.5, 1.5)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "h", "-5m", "0", "soon"])
def test_parse_duration_refuses(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("cost", "mtbf", "expected"),
    [(60, 86400, 3219.94), (1, 86400, 415.69), (0.02, 3600, 12.0), (600, 86400 * 7, 26940.0)],
)
def test_young_daly(cost, mtbf, expected):
    assert young_daly(cost, mtbf) == pytest.approx(expected, rel=1e-4)


def test_auto_interval_never_below_persist_time():
    assert auto_interval(0.001, 100, persist_s=5.0) == 5.0
    assert auto_interval(60, 86400, persist_s=5.0) == pytest.approx(3219.94, rel=1e-4)


def test_plan_arithmetic_and_optimum():
    """The worked example: a 60 s checkpoint and a failure a day."""
    rows = plan(60, 86400, [600, 3600, young_daly(60, 86400)])
    hourly = rows[1]
    assert hourly["loss_per_failure_s"] == 1800  # half an hour lost per preemption
    assert hourly["checkpoint_cost_per_day_s"] == 1440  # 24 minutes a day
    assert hourly["failure_loss_per_day_s"] == 1800
    assert rows[0]["checkpoint_cost_per_day_s"] == 8640  # every 10 min: 2.4 h a day
    best = min(rows, key=lambda r: r["total_per_day_s"])
    assert best["interval_s"] == pytest.approx(3219.94, rel=1e-4)
    assert best["total_per_day_s"] == pytest.approx(86400 * (2 * 60 / 86400) ** 0.5)


@pytest.mark.parametrize(
    ("step", "now", "every_steps", "every_seconds", "last_step", "last_time", "expected"),
    [
        (10, 0.0, 10, 0, None, 0.0, True),
        (11, 100.0, 10, 60, 10, 30.0, True),  # 70 s since the last save
        (11, 80.0, 10, 60, 10, 30.0, False),
        (10, 80.0, 0, 60, 10, 0.0, False),  # same step twice: never
        (7, 5.0, 0, 0, None, 0.0, False),
        (20, 5.0, 0, 0, None, 0.0, True),  # the final step
    ],
)
def test_due(step, now, every_steps, every_seconds, last_step, last_time, expected):
    got = due(
        step,
        now,
        every_steps=every_steps,
        every_seconds=every_seconds,
        final_step=20,
        last_step=last_step,
        last_time=last_time,
    )
    assert got is expected


@pytest.mark.parametrize(
    ("value", "best", "mode", "expected"),
    [
        (1.0, None, "min", True),
        (float("nan"), None, "min", False),
        (1.0, 2.0, "min", True),
        (2.0, 1.0, "min", False),
        (1.0, 1.0, "min", False),  # ties keep the earlier best
        (2.0, 1.0, "max", True),
        (1.0, 2.0, "max", False),
    ],
)
def test_is_better(value, best, mode, expected):
    assert is_better(value, best, mode=mode) is expected


FIXED = {"recipe.optim.lr": "the optimizer's state", "recipe.frozen.": "the model"}


@pytest.mark.parametrize(
    ("old", "new", "ignored"),
    [
        ({"recipe.optim.lr": 0.01}, {"recipe.optim.lr": 0.01}, []),
        ({"recipe.optim.lr": 0.01}, {"recipe.optim.lr": 0.5}, ["recipe.optim.lr=0.5"]),
        ({"train.steps": 10}, {"train.steps": 20}, []),  # takes effect: not fixed
        (
            {"recipe.frozen.a": 1, "recipe.frozen.b": 2},
            {"recipe.frozen.a": 1, "recipe.frozen.b": 3},
            ["recipe.frozen.b=3"],
        ),
        ({"recipe.optim.lr": 0.01}, {}, []),  # removed keys: drift's business
    ],
)
def test_ignored_on_resume(old, new, ignored):
    lines = ignored_on_resume(old, new, FIXED)
    assert [line.split(" ", 1)[0] for line in lines] == ignored
    assert all("has no effect on this resume" in line for line in lines)


@pytest.mark.parametrize(("async_save", "worst"), [(False, 1), (True, 2)])
def test_the_loss_bound_of_a_failure(async_save, worst):
    from recovery.run.policy import max_loss_intervals

    assert max_loss_intervals(async_save) == worst
    (row,) = plan(60.0, 86400.0, [600.0], async_save=async_save)
    assert row["worst_loss_per_failure_s"] == 600.0 * worst and row["loss_per_failure_s"] == 300.0


# bases: delta step -> its base's step
@pytest.mark.parametrize(
    ("steps", "bases", "keep_last", "keep_every", "expected"),
    [
        # a kept delta keeps its base; the window's deltas all hang on base 10, so the
        # newest checkpoint before it (none here) would be the independent fallback
        ([10, 20, 30, 40, 50], {20: 10, 30: 10, 40: 10, 50: 10}, 3, 0, [20]),
        # two chains in the window: no extra fallback needed, the old base stays for 40
        ([10, 20, 30, 40, 50, 60], {20: 10, 30: 10, 40: 10, 60: 50}, 3, 0, [20, 30]),
        # the window hangs on base 50 alone: 40 (and its base 10) is the fallback
        ([10, 20, 30, 40, 50, 60, 70], {20: 10, 30: 10, 40: 10, 60: 50, 70: 50}, 3, 0, [20, 30]),
        # the window is the base and its deltas: the fallback is the full checkpoint before
        ([30, 40, 50, 60], {60: 50}, 2, 0, [30]),
        # a milestone delta keeps its base forever
        ([10, 20, 30, 40, 50, 60], {20: 10, 30: 10, 40: 10, 60: 50}, 2, 20, [30]),
        # no bases: exactly the plain policy
        ([10, 20, 30, 40], {}, 2, 0, [10, 20]),
        # a base that is not on disk: the plain policy (its deltas are broken anyway)
        ([30, 40, 50], {30: 10, 40: 10, 50: 10}, 2, 0, [30]),
    ],
)
def test_to_delete_keeps_the_bases_kept_deltas_need(steps, bases, keep_last, keep_every, expected):
    got = to_delete(
        steps, newest=steps[-1], keep_last=keep_last, keep_every=keep_every, bases=bases
    )
    assert got == expected
