"""recovery.LoopState (loop variables as state), the batch digests, an own loop's exit codes."""

from __future__ import annotations

import math
import re

import pytest
import torch

import recovery
from recovery import CheckpointConfig, Checkpointer, LoopState, ResumableSampler, TrainState
from recovery.errors import ConfigError, IncompatibleStateError
from recovery.format import codec
from recovery.state.sampler import batch_digest


def round_trip(state: dict) -> dict:
    """Through the checkpoint's pickle-free codec, as a save and a load do."""
    skeleton, tensors = codec.split(state)
    return codec.join(codec.loads_json(codec.dumps_json(skeleton), name="t"), tensors)


def test_loop_variables_come_back_with_their_types_and_bits():
    hidden = (torch.randn(1, 2, 3), torch.randn(1, 2, 3))
    carry = LoopState(
        batch=(torch.arange(6).view(2, 3), torch.tensor([1, 0])),
        hidden=hidden,
        best=float("inf"),
        lr=3e-4,
        patience=2,
        note="warm",
        seen={"a": [1, 2], 3: None},
        done=False,
    )
    restored = LoopState(batch=None, hidden=None, best=0.0, lr=0.0, patience=0, note="",
                         seen={}, done=True)  # fmt: skip
    restored.load_state_dict(round_trip(carry.state_dict()))
    assert isinstance(restored.batch, tuple) and isinstance(restored.hidden, tuple)
    assert torch.equal(restored.batch[0], carry.batch[0])
    assert all(torch.equal(a, b) for a, b in zip(restored.hidden, hidden, strict=True))
    assert restored.hidden[0] is not hidden[0]  # a copy: the checkpoint's buffer is not kept
    assert math.isinf(restored.best) and restored.lr == 3e-4 and restored.patience == 2
    assert restored.seen == {"a": [1, 2], 3: None} and restored.done is False
    assert restored.note == "warm"


def test_the_variable_bound_last_is_what_is_saved():
    carry = LoopState(h=torch.zeros(2))
    carry.h = carry.h + 1  # a loop rebinds, it does not mutate
    assert torch.equal(carry.state_dict()["values"]["h"], torch.ones(2))


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (object(), "x: a object cannot be saved without pickle"),
        ([1, {2.5}], "x[1]: a set cannot be saved"),
        ({(1, 2): 3}, "x: a dict key (1, 2) (tuple)"),
    ],
)
def test_what_cannot_be_saved_without_pickle_is_refused_by_name(value, where):
    with pytest.raises(ConfigError, match=re.escape(f"LoopState.{where}")):
        LoopState(x=value)
    carry = LoopState(x=None)
    object.__setattr__(carry, "x", value)  # bound behind its back: refused at the save
    with pytest.raises(ConfigError, match="LoopState.x"):
        carry.state_dict()


def test_other_variable_names_do_not_fit_and_nothing_is_loaded():
    saved = LoopState(batch=1, hidden=2).state_dict()
    state = TrainState(loop=LoopState(batch=0))
    with pytest.raises(IncompatibleStateError, match=r"missing here: \['hidden'\]"):
        state.load_state_dict({"loop": saved, "rng": state.state_dict()["rng"]}, only=["loop"])
    assert state.components["loop"].batch == 0


def test_reserved_names():
    with pytest.raises(ConfigError, match="reserved"):
        LoopState(_x=1)


def test_the_sampler_records_what_was_drawn_since_the_last_record():
    s = ResumableSampler(10, 4, seed=0)
    assert s.take_drawn() is None
    _, a = s.next_batch()
    s.next_batch()
    both = s.take_drawn()
    assert both != batch_digest(a) and len(both) == 16
    assert s.take_drawn() is None
    _, c = s.next_batch()  # the epoch's short last batch
    assert s.take_drawn() == batch_digest(c) and s.epoch_ended and s.epoch == 1
    s.next_batch()
    assert not s.epoch_ended


@pytest.mark.parametrize(
    ("error", "code"),
    [(recovery.ConfigError("bad key"), 12), (recovery.CommitError("disk"), 14)],
)
def test_a_library_error_leaving_the_with_block_ends_with_its_exit_code(tmp_path, error, code):
    model = torch.nn.Linear(2, 2)
    state = TrainState(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        absent={"scheduler": "constant", "sampler": "none"},
    )  # fmt: skip
    ckpt = Checkpointer(CheckpointConfig(), tmp_path / "run", final_step=2)
    with pytest.raises(SystemExit) as ended, ckpt:
        ckpt.restore(state, "latest")
        raise error
    assert ended.value.code == code
    assert ckpt.closed  # closed first: the lock released, the journal closed


def test_other_exceptions_leave_the_with_block_as_they_are(tmp_path):
    with pytest.raises(KeyError), Checkpointer(CheckpointConfig(), tmp_path / "run", final_step=2):
        raise KeyError("x")
