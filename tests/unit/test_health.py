"""Resume health: the trend, the backtest band, the verdicts, the probe and the monitor."""

from __future__ import annotations

import math
import random

import pytest
import torch

from recovery.config import HealthConfig
from recovery.errors import ConfigError
from recovery.state.health import (
    OK,
    SKIPPED,
    WARN,
    HealthMonitor,
    UpdateProbe,
    backtest,
    extrapolate,
    judge,
)


@pytest.mark.parametrize(
    ("xs", "ys", "at", "expected"),
    [
        ([0, 1, 2], [1.0, 1.0, 1.0], [3], 1.0),
        ([0, 1, 2], [0.0, 2.0, 4.0], [3, 4], 7.0),
        ([10, 11, 12, 13], [5.0, 4.0, 3.0, 2.0], [14], 1.0),
        ([0, 1], [0.0, 0.0], [5], 0.0),
    ],
)
def test_extrapolate_is_the_least_squares_line(xs, ys, at, expected):
    assert extrapolate(xs, ys, at) == pytest.approx(expected)


def test_backtest_of_a_straight_line_is_zero_and_of_noise_is_its_spread():
    xs = list(range(200))
    assert backtest(xs, [0.5 - 0.001 * x for x in xs], fit=20, window=5) == pytest.approx(0.0)
    rng = random.Random(0)
    noisy = [rng.gauss(0.0, 1.0) for _ in xs]
    # the mean of 5 new points around a 20-point line: about sqrt(1/5 + 1/20 + leverage)
    assert 0.45 < backtest(xs, noisy, fit=20, window=5) < 0.75
    with pytest.raises(ValueError, match="no fit"):
        backtest(xs[:10], noisy[:10], fit=8, window=5)


def series(n, *, start=1, loss=0.7, update=2.0, seed=0, noise=0.02):
    """Records like a run's: a slowly falling loss and a smooth update size."""
    rng = random.Random(seed)
    return [
        {
            "step": float(s),
            "loss": loss - 0.0005 * s + rng.gauss(0.0, noise),
            "update": update * math.exp(-0.0005 * s + rng.gauss(0.0, 0.01)),
        }
        for s in range(start, start + n)
    ]


def judged(after_edit=None, *, n=100, window=10, fit=20, band=5.0, seed=1):
    history = series(n, seed=seed)
    after = series(window, start=n + 1, seed=seed + 100)
    if after_edit:
        after = [after_edit(dict(r)) for r in after]
    return judge(history, after, window=window, fit=fit, band=band)


@pytest.mark.parametrize(
    ("edit", "status", "departed"),
    [
        (None, OK, []),
        (lambda r: {**r, "update": r["update"] * 1.5}, WARN, ["update"]),
        (lambda r: {**r, "update": r["update"] / 1.5}, WARN, ["update"]),
        (lambda r: {**r, "loss": r["loss"] + 0.1}, WARN, ["loss"]),
        (
            lambda r: {**r, "loss": r["loss"] + 0.1, "update": r["update"] * 3},
            WARN,
            ["loss", "update"],
        ),
        (lambda r: {k: v for k, v in r.items() if k != "update"}, OK, []),
        (lambda r: {**r, "update": float("nan")}, OK, []),
    ],
)
def test_judge_flags_the_signal_that_departed(edit, status, departed):
    verdict = judged(edit)
    assert verdict.status == status, verdict.describe()
    assert verdict.departed == departed


def test_continuations_of_the_same_process_stay_inside_the_band():
    # 50 independent histories and continuations: none may warn at band 5
    statuses = {judged(seed=seed).status for seed in range(50)}
    assert statuses == {OK}


def test_a_short_history_is_not_judged():
    verdict = judge(series(25), series(10, start=26), window=10, fit=10, band=5.0)
    assert verdict.status == SKIPPED
    assert "needs 30" in verdict.reason
    assert verdict.record()["reason"] == verdict.reason


def test_a_constant_series_is_not_read_as_a_departure():
    flat = [{"step": float(s), "loss": 0.1, "update": 0.3} for s in range(1, 80)]
    after = [{"step": float(s), "loss": 0.1, "update": 0.3} for s in range(80, 90)]
    assert judge(flat, after, window=10, fit=20, band=5.0).status == OK


def test_the_record_is_the_metrics_event():
    rec = judged(lambda r: {**r, "update": r["update"] * 2}).record()
    assert rec["event"] == "resume_health" and rec["status"] == WARN
    assert rec["departed"] == ["update"] and rec["resumed_at"] == 100 and rec["steps"] == 10
    assert set(rec["signals"]["update"]) == {"observed", "expected", "se", "z"}
    assert rec["signals"]["update"]["z"] > 5


def test_update_probe_measures_the_relative_step_on_its_sample():
    a = torch.nn.Parameter(torch.ones(1000))
    b = torch.nn.Parameter(torch.full((10, 10), 2.0))
    probe = UpdateProbe([a, b], sample=110)
    assert sum(i.numel() for i in probe.index) == 110
    probe.before()
    with torch.no_grad():
        a.mul_(1.1)
        b.mul_(1.1)
    assert probe.after() == pytest.approx(0.1)
    with pytest.raises(RuntimeError, match="before"):
        probe.after()


def test_monitor_judges_the_window_after_a_load_and_round_trips_its_history():
    cfg = HealthConfig(window=5, fit=10, history=40)
    run = HealthMonitor(cfg)
    for r in series(60):
        assert run.observe(int(r["step"]), loss=r["loss"], lr=0.5, update=r["update"] * 0.5) is None
    saved = run.state_dict()
    assert len(saved["history"]) == 40 and saved["history"][-1]["step"] == 60
    resumed = HealthMonitor(cfg)
    assert resumed.check_state_dict(saved) == []
    resumed.load_state_dict(saved)
    verdicts = [
        resumed.observe(int(r["step"]), loss=r["loss"], lr=0.5, update=r["update"] * 0.5)
        for r in series(5, start=61, seed=7)
    ]
    assert verdicts[:4] == [None] * 4
    assert verdicts[4] is not None and verdicts[4].status == OK
    assert resumed.finish() is None  # judged once


def test_monitor_finish_judges_a_run_that_ends_inside_the_window():
    cfg = HealthConfig(window=20, fit=10, history=40)
    run = HealthMonitor(cfg)
    run.load_state_dict({"history": series(40)})
    for r in series(3, start=41, seed=3):
        assert run.observe(int(r["step"]), loss=r["loss"], lr=1.0, update=r["update"]) is None
    verdict = run.finish()
    assert verdict is not None and verdict.steps == 3


@pytest.mark.parametrize(
    "state", [None, {"history": "x"}, {"history": [{"loss": 1.0}]}, {"other": []}]
)
def test_monitor_refuses_what_is_not_a_history(state):
    assert HealthMonitor(HealthConfig()).check_state_dict(state)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "health.window"),
        ({"fit": 2}, "health.fit"),
        ({"history": 30}, "health.history: must be >= fit \\+ window \\+ 10 = 60"),
        ({"band": 0.0}, "health.band"),
        ({"sample": 0}, "health.sample"),
    ],
)
def test_health_config_is_validated(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        HealthConfig(**kwargs)


def test_a_resume_onto_another_shard_basis_judges_the_loss_alone():
    cfg = HealthConfig(window=5, fit=10, history=40)
    before = HealthMonitor(cfg, basis="sharded:2:0")
    for r in series(60):
        before.observe(int(r["step"]), loss=r["loss"], lr=1.0, update=r["update"])
    after = HealthMonitor(cfg, basis="sharded:1:0")
    after.load_state_dict(before.state_dict())
    assert all("update" not in r for r in after.history)
    verdicts = [
        after.observe(int(r["step"]), loss=r["loss"], lr=1.0, update=r["update"] * 3)
        for r in series(5, start=61, seed=4)
    ]
    assert verdicts[-1] is not None and set(verdicts[-1].signals) == {"loss"}
    assert verdicts[-1].status == OK  # the tripled update size is not compared across bases
