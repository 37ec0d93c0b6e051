"""recovery.run.monitoring.fingerprint: the modules' state in the per-step record."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recovery.config import ResumeCheckConfig
from recovery.errors import ConfigError
from recovery.run.monitoring import fingerprint as fp
from recovery.run.restoring.selfcheck import compare
from recovery.state.registry import TrainState


@pytest.mark.parametrize(
    ("cost_s", "step_s", "k"),
    [
        (0.0, 0.01, 1),  # free: every step
        (1e-4, 0.01, 1),  # 1 % of one step
        (1.1e-4, 0.01, 2),
        (5e-3, 0.01, 64),  # half a step: 50 steps pay for it, the power of two above
        (0.1, 0.01, 1024),
        (0.11, 0.01, None),  # past 1024 steps: never
        (1e-3, 0.0, None),  # no step time measured
    ],
)
def test_auto_takes_the_smallest_power_of_two_that_keeps_it_under_1_percent(cost_s, step_s, k):
    assert fp.every(cost_s, step_s) == k


@pytest.mark.parametrize(
    ("value", "every"),
    [("auto", None), ("off", 0), ("OFF", 0), ("16", 16), (16, 16)],
)
def test_the_setting_reads_auto_off_or_a_step_count(value, every):
    assert fp.fingerprint_every(value) == every
    ResumeCheckConfig(fingerprint=str(value))


@pytest.mark.parametrize("value", ["0", "-4", "often", "2.5", True])
def test_any_other_setting_is_refused_by_key(value):
    with pytest.raises(ConfigError, match="checkpoint.resume_check.fingerprint: expected auto"):
        ResumeCheckConfig(fingerprint=value)


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))


def test_it_tells_parameters_from_buffers_and_any_bit_of_either():
    model = bn_model()
    before = fp.fingerprint([("model", model)])
    with torch.no_grad():
        model(torch.randn(5, 3))  # train mode: only the running statistics move
    moved = fp.fingerprint([("model", model)])
    assert moved[fp.PARAMETERS] == before[fp.PARAMETERS]
    assert moved[fp.BUFFERS] != before[fp.BUFFERS]
    with torch.no_grad():
        w = model[0].weight
        w.view(-1).view(torch.int32)[0] ^= 1  # one bit of one parameter
    assert fp.fingerprint([("model", model)])[fp.PARAMETERS] != moved[fp.PARAMETERS]
    assert fp.BUFFERS not in fp.fingerprint([("m", nn.Linear(2, 2))])  # none to tell


def test_every_dtype_and_layout_has_bytes_to_hash():
    a = fp.digest([("t", torch.arange(6.0).reshape(2, 3).t())])  # not contiguous
    b = fp.digest([("t", torch.arange(6.0).reshape(2, 3).t().contiguous())])
    assert a == b
    assert fp.digest([("t", torch.ones(3, dtype=torch.bfloat16))])  # no numpy dtype
    assert fp.digest([("t", torch.zeros(0))]) != fp.digest([("t", torch.zeros(0, 2))])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def state() -> TrainState:
    model = bn_model()
    return TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_auto_measures_then_records_every_k_steps_and_the_redone_steps_asked_for():
    clock = Clock()
    prints = fp.Fingerprints(state(), "auto", clock=clock)
    assert prints.fields(1) == {} and prints.k is None  # measured (no time passes: free)
    clock.now += 0.5  # the steps between two records
    assert prints.fields(2) and prints.k == 1
    fixed = fp.Fingerprints(state(), "4", clock=clock)
    assert [s for s in range(1, 13) if fixed.fields(s)] == [4, 8, 12]
    fixed.also([5, 6])
    assert [s for s in range(5, 9) if fixed.fields(s)] == [5, 6, 8]
    off = fp.Fingerprints(state(), "off", clock=clock)
    off.also([3])
    assert not any(off.fields(s) for s in range(1, 9))


def test_the_self_check_compares_the_fingerprint_after_every_number():
    died = {"loss": 1.0, "lr": 0.1, "buffers": "a", "parameters": "b"}
    assert compare(died, {**died, "buffers": "x", "lr": 0.2}) == ("lr", 0.1, 0.2)
    assert compare(died, {**died, "buffers": "x"}) == ("buffers", "a", "x")
