"""Drill kill points (a model of the run proves each is reached) and preflight."""

import random
from pathlib import Path

import pytest

from recovery import cli
from recovery.config import CheckpointConfig
from recovery.errors import ConfigError, DrillError, PurposeError
from recovery.format.layout import step_dir_name
from recovery.run import policy
from recovery.run.checkpointer import Checkpointer
from recovery.tools import drill, killpoints
from tests.conftest import commit_state, tiny_state, train_steps

ROOT = Path(__file__).resolve().parents[2]


def reached(points, *, steps, every, keep_last=3, keep_every=0, keep_best=False):
    """Which points a model of the run reaches, each in its own victim process.

    The model is the run without timing (saves and DVC inline): a process resumes the
    newest checkpoint on disk (or starts a branch), trains to the end and commits on
    every multiple of ``every`` and the final step, and stops at its armed point. It
    uses the real retention policy; what a kill leaves behind is what the next start
    finds (a trash directory and a half-moved branch are finished by it).
    """
    disk: set[int] = set()
    best = False
    branch = None  # the start of a branch whose move a kill interrupted
    out = []
    for label in points:
        kill = killpoints.parse(label)
        if branch is not None:
            disk, branch = {s for s in disk if s <= branch}, None
        hit, start = False, max(disk, default=0)
        if kill.resume != "latest":
            start = int(kill.resume)
            assert start in disk, f"{label}: step {start} is not on disk"
            later = sorted(s for s in disk if s > start)
            if kill.fault in {f"abandon-{s}" for s in later}:
                hit, branch = True, start
            disk -= set(later)
        for step in range(start + 1, steps + 1) if not hit else ():
            if step % every == 0 or step == steps:
                if kill.fault in {f"commit-{ph}-{step}" for ph in killpoints.PHASES}:
                    hit = True
                    break
                disk.add(step)
                if keep_best and not best:
                    if kill.fault == f"best-copy-{step}":
                        hit = True  # a copy not committed: the next start removes it
                        break
                    best = True
                doomed = policy.to_delete(
                    disk, newest=step, keep_last=keep_last, keep_every=keep_every
                )
                disk -= set(doomed)
                if kill.fault in {f"retire-{n}" for n in doomed} or kill.fault in (
                    f"dvc-register-{step}",
                    f"dvc-push-{step}",
                ):
                    hit = True
                    break
            if kill.fault == f"step-{step}":
                hit = True
                break
        out.append(hit)
    return out


CONFIGS = [  # steps, every, keep_last, keep_every, keep_best, dvc
    (80, 10, 3, 0, False, False),
    (80, 10, 3, 0, True, True),
    (80, 10, 2, 20, True, False),
    (45, 10, 2, 0, False, False),
    (60, 10, 3, 0, False, True),
    (33, 4, 4, 8, True, False),
    (12, 5, 3, 0, False, False),
    (20, 10, 2, 0, True, True),
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", range(8))
def test_every_drawn_point_is_reached_after_the_resume_from_the_one_before(config, seed):
    steps, every, keep_last, keep_every, keep_best, dvc = config
    settings = dict(keep_last=keep_last, keep_every=keep_every, keep_best=keep_best)
    cap = killpoints.capacity(steps=steps, every=every, dvc=dvc, **settings)
    rng = random.Random(seed)
    for kills in sorted({0, 1, 4, 6, rng.randint(0, cap), cap} & set(range(cap + 1))):
        points = killpoints.choose_points(
            rng, steps=steps, every=every, kills=kills, dvc=dvc, **settings
        )
        assert len(points) == len(set(points)) == kills
        assert all(reached(points, steps=steps, every=every, **settings)), points
        if dvc and kills:  # the publisher's one point, after every other
            assert points[-1].split("-")[0] in ("dvc", "retire")
            assert not any(p.startswith(("dvc-", "retire-")) for p in points[:-1])


def test_the_model_catches_points_in_an_order_the_run_cannot_reach():
    # so the test above can fail: after step-40 resumes at 40, 40's commit is not redone
    assert reached(["commit-write-40", "step-41"], steps=80, every=10) == [True, True]
    assert reached(["step-40", "retire-10@40"], steps=80, every=10) == [True, False]
    assert reached(["retire-10@40", "step-40"], steps=80, every=10) == [True, False]
    assert reached(["step-45", "abandon-40@from-20"], steps=80, every=10) == [True, True]
    assert reached(["step-35", "abandon-40@from-20"], steps=80, every=10) == [True, False]
    assert reached(["step-55", "step-52"], steps=80, every=10) == [True, True]


@pytest.mark.parametrize(
    ("steps", "every", "keep_last", "keep_every", "pairs"),
    [
        (80, 10, 3, 0, [(10, 40), (20, 50), (30, 60), (40, 70), (50, 80)]),
        (80, 10, 3, 20, [(10, 40), (30, 60), (50, 80)]),  # milestones 20, 40, 60 stay
        (45, 10, 2, 0, [(10, 30), (20, 40), (30, 45)]),  # the final step commits too
        (30, 10, 3, 0, []),  # three checkpoints, all kept: no retirement to drill
    ],
)
def test_retirements_are_the_policys_in_the_commit_that_retires_them(
    steps, every, keep_last, keep_every, pairs
):
    commits = killpoints.commit_steps(steps, every)
    doomed, _ = killpoints.retention(commits, keep_last=keep_last, keep_every=keep_every)
    assert [(n, c) for c in commits for n in doomed[c]] == pairs
    drawn = {
        p
        for seed in range(40)
        for p in killpoints.choose_points(
            random.Random(seed),
            steps=steps,
            every=every,
            kills=4,
            keep_last=keep_last,
            keep_every=keep_every,
        )
        if p.startswith("retire-")
    }
    assert drawn == {f"retire-{n}@{c}" for n, c in pairs}


@pytest.mark.parametrize("seed", range(6))
def test_ten_kills_hold_every_phase_a_retirement_and_a_branch_right_after_its_anchor(seed):
    points = killpoints.choose_points(random.Random(seed), steps=80, every=10, kills=10)
    assert {p.rsplit("-", 1)[0] for p in points if p.startswith("commit-")} == {
        f"commit-{ph}" for ph in killpoints.PHASES
    }
    (retire,) = [p for p in points if p.startswith("retire-")]
    n, c = (int(x) for x in retire[len("retire-") :].split("@"))
    assert c == n + 3 * 10 and f"step-{c}" not in points
    (i,) = [i for i, p in enumerate(points) if p.startswith("abandon-")]
    anchor = int(points[i - 1].rsplit("-", 1)[1])
    assert points[i - 1].startswith("commit-") and anchor >= 30
    moved, start = (int(x) for x in points[i][len("abandon-") :].split("@from-"))
    # on disk after the commit before the anchor's: its step and keep_last - 1 before it
    assert anchor - 3 * 10 <= start < moved <= anchor - 10
    assert killpoints.parse(points[i]) == killpoints.Kill(f"abandon-{moved}", str(start), start)
    assert killpoints.parse(retire) == killpoints.Kill(f"retire-{n}", "latest", c)


def test_dvc_draws_one_background_point_last_each_kind_for_some_seed():
    last = set()
    for seed in range(30):
        points = killpoints.choose_points(
            random.Random(seed), steps=80, every=10, kills=6, dvc=True
        )
        assert all(killpoints.parse(p).step < 70 for p in points[:-1])
        last.add(points[-1])
    assert last == {"dvc-register-70", "dvc-push-70", "retire-40@70"}


def test_best_copy_is_the_first_checkpoints_and_excludes_its_step_boundary():
    for seed in range(10):
        points = killpoints.choose_points(
            random.Random(seed), steps=30, every=10, kills=31, keep_best=True
        )
        assert "best-copy-10" in points and "step-10" not in points
    assert not any(
        p.startswith("best-")
        for p in killpoints.choose_points(random.Random(0), steps=30, every=10, kills=31)
    )


@pytest.mark.parametrize(
    ("steps", "every", "extra", "cap"),
    [
        # 3 phases + retire + branch + 79 boundaries, less the retirement's own
        (80, 10, {}, 83),
        (80, 10, {"keep_best": True}, 83),  # + best-copy-10, less step-10
        (40, 10, {}, 44),  # the only retirement (10 at 40) is in the final commit
        (12, 5, {}, 14),  # no retirement, no room for a branch
        (80, 10, {"dvc": True}, 74),  # background + 3 phases + branch + 69 below 70
        (20, 10, {"dvc": True, "keep_best": True}, 13),  # 10 is L: no best copy there
    ],
)
def test_kill_counts_the_run_cannot_hold_are_refused_not_looped_on(steps, every, extra, cap):
    assert killpoints.capacity(steps=steps, every=every, **extra) == cap
    for kills in (-1, cap + 1, 10_000):
        with pytest.raises(ConfigError, match=f"--kills: expected 0 to {cap} "):
            killpoints.choose_points(
                random.Random(0), steps=steps, every=every, kills=kills, **extra
            )
    points = killpoints.choose_points(
        random.Random(0), steps=steps, every=every, kills=cap, **extra
    )
    assert len(set(points)) == cap


@pytest.mark.parametrize(("steps", "every"), [(5, 10), (10, 10), (40, 0)])
def test_no_checkpoint_to_drill_is_a_config_error(steps, every):
    with pytest.raises(ConfigError, match="no checkpoint before step"):
        killpoints.choose_points(random.Random(0), steps=steps, every=every, kills=3)


def test_drill_of_a_config_without_a_checkpoint_exits_12_before_running(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(ROOT)
    args = ["drill", "train.steps=5", "checkpoint.every_steps=10", "--out", str(tmp_path)]
    assert cli.main(args) == 12
    assert "no checkpoint before step 5" in capsys.readouterr().err
    assert not (tmp_path / "reference").exists()


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


def test_preflight_of_an_artifact_for_another_purpose_is_a_purpose_refusal(tmp_path, signer, trust):
    commit_state(tmp_path, tiny_state(), 2, signer, purpose="inference")
    path = tmp_path / step_dir_name(2)
    with pytest.raises(PurposeError, match="is a 'inference' artifact"):
        drill.preflight(path, trust)
    assert cli.main(["drill", "--preflight", str(path), "--trusted", str(signer.path.parent)]) == 18
