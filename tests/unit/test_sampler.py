import numpy as np
import pytest

from recovery.errors import ConfigError, IncompatibleStateError
from recovery.state.sampler import ResumableSampler


def consume(sampler, n):
    return [sampler.next_batch() for _ in range(n)]


def test_epoch_is_a_permutation_and_seeded():
    s = ResumableSampler(10, 4, seed=3)
    batches = consume(s, 3)
    assert [len(b) for _, b in batches] == [4, 4, 2]
    assert sorted(np.concatenate([b for _, b in batches]).tolist()) == list(range(10))
    assert (s.epoch, s.offset) == (1, 0)
    other = consume(ResumableSampler(10, 4, seed=3), 3)
    assert all((a[1] == b[1]).all() for a, b in zip(batches, other, strict=True))
    nxt = s.next_batch()
    assert nxt[0] == 1 and not (nxt[1] == batches[0][1]).all()


@pytest.mark.parametrize("cut", range(0, 9))
def test_resume_at_any_cursor_neither_replays_nor_skips(cut):
    ref = consume(ResumableSampler(23, 5, seed=7), 8)
    a = ResumableSampler(23, 5, seed=7)
    head = consume(a, cut)
    b = ResumableSampler(23, 5, seed=7)
    b.load_state_dict(a.state_dict())
    tail = consume(b, 8 - cut)
    for (e1, x1), (e2, x2) in zip(ref, head + tail, strict=True):
        assert e1 == e2 and (x1 == x2).all()


def test_drop_last():
    s = ResumableSampler(10, 4, seed=0, drop_last=True)
    assert [len(b) for _, b in consume(s, 2)] == [4, 4]
    assert (s.epoch, s.offset) == (1, 0)


@pytest.mark.parametrize(
    ("key", "value"), [("seed", 1), ("num_examples", 11), ("batch_size", 3), ("drop_last", True)]
)
def test_cursor_from_other_data_is_refused(key, value):
    state = ResumableSampler(10, 4, seed=0).state_dict() | {key: value}
    s = ResumableSampler(10, 4, seed=0)
    with pytest.raises(IncompatibleStateError, match=f"sampler.{key}"):
        s.load_state_dict(state)
    assert (s.epoch, s.offset) == (0, 0)


@pytest.mark.parametrize(("n", "b", "drop"), [(0, 1, False), (5, 0, False), (3, 4, True)])
def test_bad_arguments(n, b, drop):
    with pytest.raises(ConfigError):
        ResumableSampler(n, b, seed=0, drop_last=drop)
