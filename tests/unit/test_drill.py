import random

import pytest

from recovery.config import CheckpointConfig
from recovery.errors import ConfigError, DrillError
from recovery.format.layout import step_dir_name
from recovery.run.checkpointer import Checkpointer
from recovery.tools import drill
from tests.conftest import tiny_state, train_steps


@pytest.mark.parametrize("seed", range(5))
def test_kill_points_cover_every_commit_phase_in_run_order(seed):
    points = drill.choose_points(random.Random(seed), steps=80, every=10, kills=10)
    assert len(points) == len(set(points)) == 10
    for phase in drill.PHASES:
        assert any(p.startswith(f"commit-{phase}-") for p in points)
    order = {"write": 0, "before-manifest": 1, "before-rename": 2}
    keys = []
    for p in points:
        step = int(p.rsplit("-", 1)[1])
        phase = p[len("commit-") : p.rfind("-")] if p.startswith("commit-") else None
        keys.append((step, order.get(phase, 3)))
        if phase:
            assert step % 10 == 0 and step < 80
    assert keys == sorted(keys)


def test_no_checkpoint_to_drill():
    with pytest.raises(DrillError, match="no checkpoint"):
        drill.choose_points(random.Random(0), steps=5, every=10, kills=3)


def test_preflight_passes_on_a_real_checkpoint_and_fails_on_a_wrong_record(
    tmp_path, signer, trust, prov
):
    state = tiny_state()
    ck = Checkpointer(
        CheckpointConfig(root=str(tmp_path), every_steps=0),
        tmp_path / "run",
        final_step=10,
        signer=signer,
        trust=trust,
        provenance=prov,
    )
    ck.restore(state, None)
    train_steps(state, 3)
    ck.save(state, 3)
    result = drill.preflight(tmp_path / "run" / step_dir_name(3), trust)
    assert result["step"] == 3 and result["next_batch_size"] == 8
    train_steps(state, 1)
    real = state.expectations
    state.expectations = lambda step: {**real(step), "next_batch": [0, 1, 2, 3, 4, 5, 6, 7]}
    ck.save(state, 4)
    with pytest.raises(DrillError, match="next batch: restored"):
        drill.preflight(tmp_path / "run" / step_dir_name(4), trust)
    ck.close()


def test_dvc_registration_kill_comes_last():
    points = drill.choose_points(random.Random(2), steps=60, every=10, kills=6, dvc=True)
    assert points[-1] == "dvc-register-50"
    assert all(int(p.rsplit("-", 1)[1]) < 50 for p in points[:-1])
    assert {p.rsplit("-", 1)[0] for p in points if p.startswith("commit-")} == {
        "commit-write",
        "commit-before-manifest",
        "commit-before-rename",
    }


@pytest.mark.parametrize("kills", [-1, 10_000])
def test_kill_counts_the_run_cannot_hold_are_refused_not_looped_on(kills):
    with pytest.raises(ConfigError, match="--kills: expected 0 to"):
        drill.choose_points(random.Random(0), steps=40, every=10, kills=kills)
    assert len(drill.choose_points(random.Random(0), steps=12, every=5, kills=14)) == 14
