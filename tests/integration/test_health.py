"""The resume health monitor on real processes: a good resume passes, a bad one warns."""

from __future__ import annotations

import json
import shutil

from recovery.format.layout import METRICS_FILE
from recovery.state.registry import DROP_ENV

# history of 50 steps at the resume; a judgement needs fit + window + 10 = 30
HEALTH = ("health.fit=10", "health.window=10", "health.history=60")


def health_events(run_dir):
    lines = (run_dir / METRICS_FILE).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == "resume_health"]


def test_a_good_resume_is_healthy_and_lost_optimizer_moments_warn(trainer, tmp_path):
    good = tmp_path / "good"
    killed = trainer(good, *HEALTH, pause_at="step-52")
    assert killed.returncode != 0
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)

    resumed = trainer(good, *HEALTH, "+resume=latest")
    assert resumed.returncode == 0, resumed.output
    [event] = health_events(good / "r")
    assert event["status"] == "ok", event
    assert event["resumed_at"] == 50 and event["steps"] == 10 and event["step"] == 60
    assert set(event["signals"]) == {"loss", "update"}
    assert "DEPARTED" not in resumed.output

    dropped = trainer(bad, *HEALTH, "+resume=latest", env_extra={DROP_ENV: "optimizer"})
    assert dropped.returncode == 0, dropped.output
    [event] = health_events(bad / "r")
    assert event["status"] == "warn", event
    assert "update" in event["departed"]
    # Adam restarted: its first update is far larger than the warmed-up one's
    update = event["signals"]["update"]
    assert update["observed"] > 1.5 * update["expected"]
    assert "resume health DEPARTED" in dropped.output


def test_a_fresh_run_records_update_sizes_and_no_verdict(trainer, tmp_path):
    run = trainer(tmp_path / "fresh", *HEALTH)
    assert run.returncode == 0, run.output
    assert health_events(tmp_path / "fresh" / "r") == []
    steps = [
        json.loads(line)
        for line in (tmp_path / "fresh" / "r" / METRICS_FILE).read_text().splitlines()
    ]
    updates = [r["update"] for r in steps if "event" not in r]
    assert len(updates) == 80 and all(u > 0 for u in updates)
