"""Hydra as its users drive it: sweeps (each job its own run, a killed sweep resumed job by
job), the inspection flags, no secret in what Hydra writes, logs outside the runs."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from recovery.format.layout import METRICS_FILE, scan
from recovery.run.journal import effective_steps
from tests import launcher
from tests.integration.conftest import ROOT, SMALL, STEPS, TRAIN, assert_same_run

SECRET = "hunter2-do-not-log"


def job_dirs(run_dir: Path) -> dict[str, Path]:
    """``seed=N`` -> the sweep job's run directory under ``run_dir`` (the seed its newest
    checkpoint's config records: a long job name is shortened with a digest)."""
    jobs = {}
    for d in run_dir.iterdir():
        *_, (_, newest) = scan(d).committed
        jobs[f"seed={yaml.safe_load((newest / 'config.yaml').read_text())['seed']}"] = d
    return jobs


def test_a_killed_sweep_resumes_each_job_in_its_own_run(trainer, tmp_path, reference, trust):
    root = tmp_path / "sweep"
    # hydra.mode=MULTIRUN is -m as an override (Hydra takes -m before the overrides only)
    sweep = ["hydra.mode=MULTIRUN", "seed=choice(0,1)", f"+db.password={SECRET}"]
    killed = trainer(root, *sweep, pause_at="step-30")  # in the first job, seed=0
    assert killed.returncode != 0
    first = job_dirs(root / "r.sweep")
    assert list(first) == ["seed=0"] and [s for s, _ in scan(first["seed=0"]).committed][-1] == 30
    # requeued: the first job resumes past step 30 and ends; the second is killed at its 30
    again = trainer(root, *sweep, "+resume=latest", pause_at="step-30")
    assert again.returncode != 0 and sorted(job_dirs(root / "r.sweep")) == ["seed=0", "seed=1"]
    done = trainer(root, *sweep, "+resume=latest")
    assert done.returncode == 0, done.output
    jobs = job_dirs(root / "r.sweep")
    # the sweep says per job how it went: the finished one not retrained, the killed one
    # resumed where it was killed, each named by what tells it apart (no secret)
    assert "sweep: 2 jobs" in done.output
    assert (
        f"#0 seed=0: run {jobs['seed=0']}: finished at step {STEPS} before: nothing to train"
        in done.output
    )
    assert f"#1 seed=1: run {jobs['seed=1']}: resumed from step 30, trained to step {STEPS}" in (
        done.output
    )
    assert_same_run(reference, jobs["seed=0"], trust)  # each resumed, exactly
    seed1 = trainer(tmp_path / "seed1", "seed=1")  # the second job's uninterrupted run
    assert seed1.returncode == 0, seed1.output
    assert_same_run(seed1.run_dir, jobs["seed=1"], trust)
    assert (
        effective_steps(jobs["seed=1"] / METRICS_FILE)[1]["batch"]
        != (effective_steps(jobs["seed=0"] / METRICS_FILE)[1]["batch"])
    )
    # Hydra's logs and multirun.yaml beside the runs, and no secret in any file under root
    logs = root / ".hydra" / "r"
    assert len(list(logs.glob("multirun-*/multirun.yaml"))) == 3
    assert not any(p.name.startswith("multirun") for p in (root / "r.sweep").rglob("*"))
    leaked = [p for p in root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked, leaked


def test_hydras_inspection_flags_work_and_leave_nothing(tmp_path):
    base = [sys.executable, str(TRAIN), f"checkpoint.root={tmp_path}", "run.name=r"]
    for flags, shows in [
        (["--cfg", "job"], "every_steps:"),
        (["-c", "job", "-p", "checkpoint", "--resolve"], "every_steps:"),
        (["--cfg", "hydra"], "override_dirname:"),
        (["--info", "defaults"], "Defaults List"),
    ]:
        done = launcher.run([*base, *flags], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and shows in done.stdout, (flags, done.stderr[-2000:])
    bad = launcher.run(
        [*base, "-m", "seed=0,1", "--cfg", "job"], cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode == 12 and "cannot be combined" in bad.stderr, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    assert not (tmp_path / "r").exists() and not (tmp_path / ".hydra").exists()


def test_a_refused_start_leaves_nothing_behind(tmp_path, data_root):
    cmd = [sys.executable, str(TRAIN), f"checkpoint.root={tmp_path}", "run.name=r"]
    done = launcher.run(
        [*cmd, "+init_from=/nonexistent", f"recipe.data.root={data_root}", *SMALL],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3 and "no such checkpoint" in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))
