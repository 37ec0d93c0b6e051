"""Branches and the kill windows of moves and deletions, on real processes killed there."""

from __future__ import annotations

import pytest

from recovery.format.layout import ABANDONED_DIR, scan, step_dir_name
from recovery.run.journal import read
from recovery.run.restoring import choose
from tests.integration.conftest import assert_same_run

pytestmark = pytest.mark.integration


def resumed_at(run_dir) -> list[int]:
    return [r["step"] for r in read(run_dir / "metrics.jsonl") if r.get("event") == "resume"]


def test_a_branch_killed_mid_move_and_requeued_continues_the_branch(
    tmp_path, trainer, reference, trust
):
    first = trainer(tmp_path, pause_at="step-61")  # checkpoints 40, 50, 60 on disk
    assert first.returncode == -9
    run_dir = first.run_dir
    # branch at 40, killed while moving the abandoned future aside (50 moved, 60 not yet)
    branch = trainer(tmp_path, "+resume=40", pause_at="abandon-60")
    assert branch.returncode == -9
    assert "BRANCH: resumed at step 40" in branch.output
    (moved,) = (run_dir / ABANDONED_DIR).iterdir()
    assert [p.name for p in moved.iterdir()] == [step_dir_name(50)]
    assert [s for s, _ in scan(run_dir).committed] == [40, 60]
    # requeued with latest: the move is finished first, and the branch (40) continues
    requeued = trainer(tmp_path, "+resume=latest", pause_at="step-55")
    assert requeued.returncode == -9
    assert sorted(p.name for p in moved.iterdir()) == [step_dir_name(50), step_dir_name(60)]
    assert "ROLLBACK" not in requeued.output and resumed_at(run_dir)[-1] == 40
    for old in moved.iterdir():  # still verifiable where they were moved
        assert choose.load(old, trust).decoded.step in (50, 60)
    done = trainer(tmp_path, "+resume=latest", "recipe.optim.lr=0.5")
    assert done.returncode == 0, done.output
    assert "OVERRIDE IGNORED: recipe.optim.lr=0.5" in done.output  # and the run is unchanged
    assert resumed_at(run_dir)[-1] == 50  # the branch's own step 50
    assert_same_run(reference, run_dir, trust)


def test_a_kill_between_the_renames_of_a_resave_keeps_the_old_checkpoint(
    tmp_path, trainer, reference, trust
):
    first = trainer(tmp_path, pause_at="step-31")
    newest = first.run_dir / step_dir_name(30)
    (newest / "rng.safetensors").chmod(0o644)
    (newest / "rng.safetensors").write_bytes(b"damaged")
    # falls back to 20 and re-saves 30 over the damaged one: killed with the old one aside
    resave = trainer(tmp_path, "+resume=latest", pause_at="commit-aside-30")
    assert resave.returncode == -9 and not newest.exists()
    assert any(".aside-" in p.name for p in scan(first.run_dir).stale)
    done = trainer(tmp_path, "+resume=latest")
    assert done.returncode == 0, done.output
    assert f"restoring {newest}" in done.output  # put back, never deleted as stale
    assert resumed_at(first.run_dir)[-1] == 20
    assert_same_run(reference, first.run_dir, trust)


def test_a_kill_during_retention_leaves_no_half_deleted_checkpoint(
    tmp_path, trainer, reference, trust
):
    first = trainer(tmp_path, pause_at="retire-10")  # committing 40 retires 10
    assert first.returncode == -9
    listing = scan(first.run_dir)
    assert [s for s, _ in listing.committed] == [20, 30, 40]  # 10 is a trash name already
    assert [p.name.split(".")[1][:5] for p in listing.stale] == ["trash"]
    done = trainer(tmp_path, "+resume=latest")
    assert done.returncode == 0, done.output
    assert scan(first.run_dir).stale == [] and resumed_at(first.run_dir) == [40]
    assert_same_run(reference, first.run_dir, trust)
