"""Kill-and-resume equivalence on real processes: the heart of exact resume."""

from __future__ import annotations

import json
import shutil

import pytest

from recovery import cli
from recovery.format.layout import scan, step_dir_name
from recovery.run.journal import read
from tests.conftest import once
from tests.integration.conftest import assert_same_run, final_state

pytestmark = pytest.mark.integration


def T(signer):
    return ["--trusted", str(signer.path.parent)]


@pytest.mark.key
@pytest.mark.parametrize(
    ("kill_at", "expect_from"),
    [
        ("step-45", 40),  # mid-epoch 1: checkpoint 40, killed 5 steps later
        ("step-36", 30),  # checkpoint 30 in epoch 0, killed in epoch 1: resume crosses the boundary
    ],
    ids=["mid-epoch", "across-epoch-boundary"],
)
def test_sigkill_between_checkpoints_then_resume_is_bit_identical(
    tmp_path, trainer, reference, trust, signer, kill_at, expect_from
):
    # The same requeue-safe command line both times: +resume=latest on an empty run starts fresh.
    first = trainer(tmp_path, "+resume=latest", pause_at=kill_at)
    assert first.returncode == -9
    assert "no checkpoint in" in first.output and "starting a fresh run" in first.output
    second = trainer(tmp_path, "+resume=latest")
    assert second.returncode == 0, second.output
    resumes = [r for r in read(second.run_dir / "metrics.jsonl") if r.get("event") == "resume"]
    assert resumes[-1]["step"] == expect_from
    assert resumes[-1]["from"].endswith(step_dir_name(expect_from))
    # the recipe's resume checked itself: the steps the dead process journaled, redone equal
    redone = int(kill_at.split("-")[1]) - expect_from
    checks = [r for r in read(second.run_dir / "metrics.jsonl") if r.get("event") == "resume_check"]
    assert [(c["status"], c["compared"], c["identical"]) for c in checks] == [
        ("exact", redone, redone)
    ]
    assert f"resume check: {redone} redone steps bit-identical" in second.output
    assert_same_run(reference, second.run_dir, trust)


def test_a_sparse_embedding_run_killed_and_resumed_is_bit_identical(tmp_path, trainer, trust):
    """recipe.optim.sparse=true: the tables' SparseAdam (which moves only the rows a batch
    touched) and the bias's Adam, each with its schedule, resume exactly mid-epoch."""
    reference = trainer(tmp_path / "ref", "recipe.optim.sparse=true")
    assert reference.returncode == 0, reference.output
    first = trainer(tmp_path / "job", "recipe.optim.sparse=true", pause_at="step-45")
    assert first.returncode == -9
    second = trainer(tmp_path / "job", "recipe.optim.sparse=true", "+resume=latest")
    assert second.returncode == 0, second.output
    resumes = [r for r in read(second.run_dir / "metrics.jsonl") if r.get("event") == "resume"]
    assert resumes[-1]["step"] == 40
    state = final_state(second.run_dir, trust)
    assert {"sparse_optimizer", "sparse_scheduler"} <= state.keys()
    moments = state["sparse_optimizer"]["state"]
    assert len(moments) == 4  # user, item and both bias tables: SparseAdam's rows
    assert_same_run(reference.run_dir, second.run_dir, trust)


@pytest.mark.parametrize("phase", ["write", "before-manifest", "before-rename"])
def test_sigkill_during_checkpoint_write_never_uses_the_partial_dir(
    tmp_path, trainer, reference, trust, signer, phase
):
    first = trainer(tmp_path, pause_at=f"commit-{phase}-40")
    assert first.returncode == -9
    listing = scan(first.run_dir)
    assert [s for s, _ in listing.committed] == [10, 20, 30]
    assert len(listing.stale) == 1 and listing.stale[0].name.startswith("step-00000040.tmp-")
    assert (
        cli.main(["verify", str(listing.stale[0]), *T(signer)]) == 4
    )  # never trusted, even if complete

    second = trainer(tmp_path, "+resume=latest")
    assert second.returncode == 0, second.output
    assert "interrupted checkpoint write that never committed" in second.output
    resumes = [r for r in read(second.run_dir / "metrics.jsonl") if r.get("event") == "resume"]
    assert resumes[-1]["step"] == 30
    assert scan(second.run_dir).stale == []
    assert_same_run(reference, second.run_dir, trust)


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-7])


@pytest.mark.parametrize(
    ("damage", "file", "code", "words"),
    [
        (_flip, "model.safetensors", 9, "expected sha256"),
        (_truncate, "optimizer.safetensors", 8, "expected"),
        (lambda p: p.unlink(), "rng.safetensors", 6, "not found on disk"),
    ],
    ids=["flipped-byte", "truncated", "deleted"],
)
def test_corrupt_newest_checkpoint_is_refused_and_resume_falls_back(
    tmp_path, trainer, reference, trust, signer, capsys, shared_dir, damage, file, code, words
):
    # Run B killed right after its final checkpoint (step 80) was committed: step-80 is
    # newest (killed once for the session; each damage is done to a copy)
    def make(root):
        assert trainer(root, pause_at="step-80").returncode == -9

    shutil.copytree(once(shared_dir / "killed-at-80", make), tmp_path, dirs_exist_ok=True)
    newest = tmp_path / "r" / step_dir_name(80)
    damage(newest / file)

    assert cli.main(["verify", str(newest), "--json", *T(signer)]) == code
    err = capsys.readouterr().err
    assert file in err and words in err

    second = trainer(tmp_path, "+resume=latest")
    assert second.returncode == 0, second.output
    assert "RESUME FALLBACK" in second.output and file in second.output
    resumes = [r for r in read(second.run_dir / "metrics.jsonl") if r.get("event") == "resume"]
    assert resumes[-1]["step"] == 70 and resumes[-1]["skipped"] == [str(newest)]
    assert cli.main(["verify", str(newest), *T(signer)]) == 0  # re-saved over the damaged one
    assert_same_run(reference, second.run_dir, trust)


def test_resume_into_a_different_model_is_refused_with_every_mismatch(tmp_path, trainer):
    first = trainer(tmp_path, "train.steps=20")
    assert first.returncode == 0, first.output
    before = sorted(p.name for p in first.run_dir.iterdir())
    second = trainer(tmp_path, "train.steps=40", "recipe.model.dim=8", "+resume=latest")
    assert second.returncode == 11, second.output
    for key in ("user.weight", "item.weight"):
        assert f"{key}: checkpoint shape" in second.output
    assert sorted(p.name for p in first.run_dir.iterdir()) == before


def test_ls_and_inspect_on_a_real_run(reference, capsys, signer):
    assert cli.main(["ls", str(reference), "--json", *T(signer)]) == 0
    rows = json.loads(capsys.readouterr().out)["checkpoints"]
    assert [r["step"] for r in rows] == [60, 70, 80] and all(r["verified"] for r in rows)
    assert cli.main(["inspect", str(reference / step_dir_name(80)), "--json", *T(signer)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["step"] == 80 and info["components"] == [
        "config",
        "health",
        "lineage",
        "model",
        "model_config",
        "optimizer",
        "provenance",
        "rng",
        "sampler",
        "scheduler",
    ]
    assert info["signer"]["trusted"] and not info["signer"]["dev"]
    assert info["code"]["git"] is True and len(info["code"]["commit"]) == 40
    assert info["dataset"]["source"] == "untracked" and info["dataset"]["nfiles"] == 4  # 2 shards
