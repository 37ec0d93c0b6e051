"""The classifier recipe: augmentation in DataLoader workers, and still exact."""

from __future__ import annotations

import json
import os
import sys

import pytest

from recovery import cli
from recovery.run.journal import effective_steps
from tests import launcher
from tests.integration.conftest import ROOT, TRAIN

pytestmark = pytest.mark.integration

CLASSIFIER = [
    "recipe=classifier",
    "train.steps=40",
    "checkpoint.every_steps=10",
    "train.log_every=20",
]


def test_worker_count_does_not_change_batches_or_losses(tmp_path, signer):
    runs = {}
    env = {**os.environ, "RECOVERY_SIGNING_KEY": str(signer.path)}
    for workers in (0, 1, 2):
        root = tmp_path / f"w{workers}"
        done = launcher.run(
            [
                sys.executable,
                str(TRAIN),
                *CLASSIFIER,
                f"recipe.num_workers={workers}",
                "checkpoint.keep_best=true",  # ranked by the recipe's own metric, val_loss
                f"checkpoint.root={root}",
                "run.name=c",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        runs[workers] = effective_steps(root / "c" / "metrics.jsonl")
    assert sorted(runs[0]) == list(range(1, 41))
    (best,) = (tmp_path / "w0" / "c" / "best").iterdir()
    assert cli.main(["verify", str(best), "--allow-untrusted"]) == 0
    assert {r["epoch"] for r in runs[0].values()} == {0, 1}  # 24 batches an epoch: crosses one
    for workers in (1, 2):
        for step, rec in runs[0].items():
            other = runs[workers][step]
            assert (other["batch"], other["loss"], other["lr"]) == (
                rec["batch"],
                rec["loss"],
                rec["lr"],
            )


def test_drill_passes_on_the_classifier_with_workers_amp_and_async_saves(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("RECOVERY_DRILL_DROP", raising=False)
    code = cli.main(
        [
            "drill",
            *CLASSIFIER,
            "recipe.amp=true",
            "checkpoint.async=true",
            # the three commit phases, a retirement, a branch and one step boundary: every
            # kind of kill point the drill draws for this run (more add step boundaries)
            "--kills",
            "6",
            "--seed",
            "5",
            "--out",
            str(tmp_path / "drill"),
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["differences"]
    reached = [k["point"] for k in report["kills"] if k["reached"]]
    assert len(reached) == 6
    for kind in ("commit-write-", "commit-before-manifest-", "commit-before-rename-"):
        assert any(p.startswith(kind) for p in reached), (kind, reached)
    for kind in ("retire-", "abandon-", "step-"):
        assert any(p.startswith(kind) for p in reached), (kind, reached)
