"""Differential checkpoints on real processes: SIGKILL after a delta, the drill, DVC."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from recovery import cli
from recovery.config import DifferentialConfig
from recovery.format.layout import METRICS_FILE, scan, step_dir_name
from recovery.run.journal import read
from recovery.run.restoring import choose
from tests.integration.conftest import ROOT, SMALL, assert_same_run, recovery_export
from tests.integration.test_tracking import project, train  # noqa: F401  (project: a fixture)
from tests.unit.test_differential import sparse_state, train_step

pytestmark = pytest.mark.integration

# tables large enough against a 10-step interval that only some rows change: 5000 users
# and 2000 items, 640 examples an interval
DIFF = [
    "recipe.data.num_users=5000",
    "recipe.data.num_items=2000",
    "recipe.optim.sparse=true",
    "checkpoint.differential.enabled=true",
    "checkpoint.differential.full_every=3",
    "checkpoint.differential.min_mb=0",
]


@pytest.fixture(scope="module")
def diff_data(tmp_path_factory):
    return tmp_path_factory.mktemp("diff-data") / "interactions"


def test_sigkill_after_a_delta_then_resume_latest_is_bit_identical(
    tmp_path, trainer, trust, diff_data
):
    reference = trainer(tmp_path / "ref", *DIFF, data=diff_data)
    assert reference.returncode == 0, reference.output
    # saves 10 (base), 20, 30, 40 (base), 50, 60, 70 (base), 80: killed 5 steps after 50
    first = trainer(tmp_path / "job", *DIFF, "+resume=latest", pause_at="step-55", data=diff_data)
    assert first.returncode == -9
    newest = choose.load(first.run_dir / step_dir_name(50), trust)
    assert newest.delta is not None and newest.delta["base"] == step_dir_name(40)
    second = trainer(tmp_path / "job", *DIFF, "+resume=latest", data=diff_data)
    assert second.returncode == 0, second.output
    (resumed,) = [r for r in read(second.run_dir / METRICS_FILE) if r.get("event") == "resume"]
    assert resumed["step"] == 50 and resumed["base"].endswith(step_dir_name(40))
    assert_same_run(reference.run_dir, second.run_dir, trust)
    final = choose.load(second.run_dir / step_dir_name(80), trust)
    assert final.delta is not None and final.delta["base"] == step_dir_name(70)
    # the deltas of the run are smaller than its bases
    sizes = {
        r["step"]: r["bytes"]
        for r in read(reference.run_dir / METRICS_FILE)
        if r.get("event") == "checkpoint"
    }
    assert max(sizes[s] for s in (20, 30, 50, 60, 80)) < min(sizes[s] for s in (10, 40, 70))


PHASES = ("write", "before-manifest", "before-rename")


@pytest.mark.parametrize("step", [30, 40], ids=["a link", "a consolidation"])
def test_chained_deltas_killed_at_every_commit_phase_of_a_link_and_of_a_consolidation(
    tmp_path, trainer, trust, diff_data, step
):
    """Saves 10 (full), 20 (a delta of 10), 30 (a delta of 20: a link), 40 (full: the chain
    consolidated), 50, ... 80: SIGKILL in each commit phase of 30 and of 40, then +resume=latest,
    is the uninterrupted run bit for bit, every link of it."""
    reference = trainer(tmp_path / "ref", *DIFF, data=diff_data)
    assert reference.returncode == 0, reference.output
    for phase in PHASES:
        root = tmp_path / phase
        point = f"commit-{phase}-{step}"
        first = trainer(root, *DIFF, pause_at=point, data=diff_data)
        assert first.returncode == -9, point
        assert [s for s, _ in scan(first.run_dir).committed] == [10, 20, 30][: step // 10 - 1]
        second = trainer(root, *DIFF, "+resume=latest", data=diff_data)
        assert second.returncode == 0, second.output
        (resumed,) = [r for r in read(second.run_dir / METRICS_FILE) if r.get("event") == "resume"]
        assert resumed["step"] == step - 10, point
        assert_same_run(reference.run_dir, second.run_dir, trust)
        for s in (50, 60, 80):  # every link kept restores, its chain whole
            loaded = choose.load(second.run_dir / step_dir_name(s), trust)
            assert loaded.delta["base"] == step_dir_name(s - 10), (point, s)


def test_export_and_warm_start_read_a_delta_through_its_base(
    tmp_path, trainer, signer, trust, diff_data
):
    first = trainer(tmp_path / "a", *DIFF, "train.steps=50", data=diff_data)
    assert first.returncode == 0, first.output
    delta = first.run_dir / step_dir_name(50)  # a delta of 40
    out = tmp_path / "served"
    overrides = [*SMALL, *DIFF, "train.steps=50", f"recipe.data.root={diff_data}"]
    overrides += [f"checkpoint.root={tmp_path / 'a'}", "export.source=50", f"export.out={out}"]
    done = recovery_export(overrides, signer)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "parity: max_abs_diff 0," in done.stdout + done.stderr
    assert cli.main(["verify", str(out), "--trusted", str(signer.path.parent)]) == 0
    parent = choose.load(out, trust).manifest.recovery["parent"]
    assert parent["sha256"] == choose.load(delta, trust).manifest.root
    warm = trainer(tmp_path / "b", *DIFF, f"+init_from={delta}", "train.steps=10", data=diff_data)
    assert warm.returncode == 0, warm.output
    (start,) = [r for r in read(warm.run_dir / METRICS_FILE) if r.get("event") == "warm_start"]
    assert start["from"] == str(delta)
    parent = choose.load(warm.run_dir / step_dir_name(10), trust).manifest.recovery["parent"]
    assert (
        parent["kind"] == "warm_start"
        and parent["sha256"] == choose.load(delta, trust).manifest.root
    )


def test_a_delta_without_its_base_is_refused_and_the_run_falls_back(
    tmp_path, trainer, trust, signer, diff_data
):
    first = trainer(tmp_path, *DIFF, "train.steps=60", data=diff_data)
    assert first.returncode == 0, first.output
    shutil.rmtree(first.run_dir / step_dir_name(40))  # the base of 50 and 60
    code = cli.main(
        ["verify", str(first.run_dir / step_dir_name(60)), "--trusted", str(signer.path.parent)]
    )
    assert code == 29
    second = trainer(tmp_path, *DIFF, "+resume=latest", data=diff_data)
    assert second.returncode == 0, second.output
    assert "is a delta of step-00000040 (step 40), which is missing" in second.output
    resumes = [r for r in read(second.run_dir / METRICS_FILE) if r.get("event") == "resume"]
    # 60 and 50 hang on the missing base; 30 (a delta of 10) is whole
    assert resumes[-1]["step"] == 30 and len(resumes[-1]["skipped"]) == 2


def test_the_drill_passes_with_differential_saves(tmp_path, diff_data, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("RECOVERY_DRILL_DROP", raising=False)
    overrides = [o for o in SMALL if not o.startswith("run.name=")]
    args = [
        "drill",
        f"recipe.data.root={diff_data}",
        *overrides,
        *DIFF,
        # saves 10 (full), 20, 30 (a chain of deltas), 40 (full), 50, 60, 70 (full: the chain
        # 10-30 is retired once none of the newest three hang on it)
        "train.steps=70",
        "--kills",
        "6",
        "--seed",
        "1",
        "--out",
        str(tmp_path / "drill"),
        "--json",
    ]
    code = cli.main(args)
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["differences"]
    assert report["passed"] and report["level"] == "bitwise"
    reached = [k["point"] for k in report["kills"] if k["reached"]]
    assert len(reached) == 6 and any(p.startswith("retire-") for p in reached)
    victim = tmp_path / "drill" / "victim" / "drill"
    resumes = [r for r in read(victim / METRICS_FILE) if r.get("event") == "resume"]
    assert any(r.get("base") for r in resumes), "no resume started from a delta"


def _train_dvc(root, steps, signer, trust, prov, *, resume_spec=None):
    """The sparse state to ``steps`` with differential saves every 2 steps, each registered
    and pushed (the end of the run waits for the pushes)."""
    on = DifferentialConfig(enabled=True, full_every=3, min_mb=0)
    state, run_dir, _ = train(
        root,
        steps,
        signer,
        trust,
        prov,
        resume=resume_spec,
        differential=on,
        make_state=sparse_state,
        step_fn=train_step,
    )
    return state, run_dir


def _remote_bytes(remote):
    return sum(p.stat().st_size for p in remote.rglob("*") if p.is_file())


def test_dvc_pushes_only_the_new_bytes_and_a_fresh_machine_resumes_from_a_delta(
    project,  # noqa: F811
    signer,
    trust,
    prov,
):
    ref, _ = _train_dvc(project, 8, signer, trust, prov)
    shutil.rmtree(project / "checkpoints")
    remote = project.parent / "remote"
    shutil.rmtree(remote)
    # the run that died at 6 (2 full, 4 and 6 a chain of deltas on it), pushed as it went: here one
    # process per save, each continuing the chain, so the remote is measured after each
    pushed = {}
    for step in (2, 4, 6):
        _, run_dir = _train_dvc(project, step, signer, trust, prov, resume_spec="latest")
        pushed[step] = _remote_bytes(remote)
    on_disk = {s: _remote_bytes(run_dir / step_dir_name(s)) for s in (2, 4, 6)}
    assert pushed[2] >= on_disk[2]  # the base went whole
    for before, step in ((2, 4), (4, 6)):
        grew = pushed[step] - pushed[before]
        # a delta sends its own files (and DVC's listing of them, under 1 KiB), no more
        assert on_disk[step] <= grew <= on_disk[step] + 1024
        assert grew < on_disk[2] / 1.5
    keep = {p.name: p.read_bytes() for p in run_dir.glob("*.dvc")}
    keep[".gitignore"] = (run_dir / ".gitignore").read_bytes()
    shutil.rmtree(run_dir)
    shutil.rmtree(project / ".dvc" / "cache")
    run_dir.mkdir(parents=True)
    for name, data in keep.items():
        (run_dir / name).write_bytes(data)
    state, _ = _train_dvc(project, 8, signer, trust, prov, resume_spec="latest")
    resumed = [r for r in read(run_dir / METRICS_FILE) if r.get("event") == "resume"][-1]
    # its chain (4, then 2) fetched from the remote link by link
    assert resumed["step"] == 6 and resumed["base"].endswith(step_dir_name(4))
    for k, v in ref.components["model"].state_dict().items():
        assert torch.equal(state.components["model"].state_dict()[k], v), k
    assert [s for s, _ in scan(run_dir).committed] == [2, 4, 6, 8]  # 6 keeps its chain
