import pytest

from recovery.policy import should_save, to_delete


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
