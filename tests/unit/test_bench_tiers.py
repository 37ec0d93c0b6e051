"""benchmarks/bench_tiers.py's arithmetic: what a calibration run's journal says each tier
costs, the intervals chosen from it, and a run's figures (no process is started)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_tiers", ROOT / "benchmarks/bench_tiers.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_costs_are_the_medians_of_each_kind_of_save():
    records = [
        {"event": "checkpoint", "mode": "async", "pause_s": 0.1, "write_s": 1.0},
        {"event": "checkpoint", "mode": "async", "pause_s": 0.3, "write_s": 3.0},
        {"event": "checkpoint", "mode": "async", "pause_s": 0.2, "write_s": 2.0},
        {"event": "snapshot", "pause_s": 0.05, "write_s": 0.4},
        {"event": "checkpoint", "mode": "promoted", "pause_s": 0.05, "write_s": 1.5},
        {"step": 3, "loss": 1.0},
    ]
    assert bench.costs(records) == {
        "save_pause_s": 0.2,
        "save_write_s": 2.0,
        "snapshot_pause_s": 0.05,
        "snapshot_write_s": 0.4,
        "promote_write_s": 1.5,
    }


CAL = {"save_pause_s": 0.5, "save_write_s": 0.5, "snapshot_pause_s": 0.02}


@pytest.mark.parametrize(
    ("cal", "every", "local_every", "every2"),
    [
        # Young/Daly binds: sqrt(2*0.5*100) = 10 s = 100 steps; local sqrt(2*0.02*100/0.9)
        # = 2.1 s = 21 steps; persistent sqrt(2*0.5*100/0.1) = 31.6 s, 316 -> 336 (16 x 21)
        ({**CAL, "snapshot_write_s": 0.3, "promote_write_s": 1.0}, 100, 21, 336),
        # the writes bind: 12 s -> 120 steps, a snapshot's 5 s -> 50; persistent 316 -> 350 (7 x 50)
        (
            {**CAL, "save_write_s": 12.0, "snapshot_write_s": 5.0, "promote_write_s": 25.0},
            120,
            50,
            350,
        ),
    ],
)
def test_intervals_are_young_daly_bounded_below_by_each_write(cal, every, local_every, every2):
    got = bench.choose(cal, mtbf_s=100.0, step_s=0.1, host_loss=0.1)
    assert (got["every"], got["local_every"], got["every2"]) == (every, local_every, every2)
    assert got["every2"] % got["local_every"] == 0
    assert f"every {every} steps" in got["why"]["one"]


def test_a_run_summary_counts_redone_steps_and_every_pause():
    records = [
        {"step": 1},
        {"event": "first_step", "step": 1, "resumed": False, "seconds_since_process_start": 9},
        {"step": 2},  # killed: no checkpoint yet
        {"step": 1},
        {"event": "first_step", "step": 1, "resumed": False, "seconds_since_process_start": 8},
        {"step": 9},
        {"event": "snapshot", "pause_s": 0.1},
        {"step": 10},  # killed
        {"event": "resume", "step": 8},
        {"step": 9},
        {"event": "first_step", "step": 9, "resumed": True, "seconds_since_process_start": 2.0},
        {"event": "checkpoint", "mode": "async", "pause_s": 0.2, "wait_s": 0.3},
        {"event": "checkpoint", "mode": "promoted", "pause_s": 0.1, "wait_s": 0.4},
        {"event": "snapshot", "pause_s": 0.1, "skipped": 1},
    ]
    got = bench.summarise(records, compute_s=10.0)
    assert got["redone"] == [2, 2] and got["restart_to_first_step_s"] == 2.0
    assert got["checkpoint_pause_s"] == pytest.approx(0.1 + 0.2 + 0.3 + 0.4 + 0.1)
    assert (got["pauses"], got["skipped"]) == (3, 1)
    # the last save's wait (for the write in flight) is paid once a run: told apart
    assert got["end_wait_s"] == 0.4
    assert got["pause_before_end_s"] == pytest.approx(got["checkpoint_pause_s"] - 0.4)
    # lost in all: the pause, and per failure the redone steps and the restart
    lost = bench.time_lost({**got, "redone_per_failure": 2.0}, kills=2, step_s=0.5)
    assert lost == pytest.approx(got["checkpoint_pause_s"] + 2 * (2.0 * 0.5 + 2.0))
