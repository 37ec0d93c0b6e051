"""A fresh run into a run directory holding checkpoints is refused before torch is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from recovery.errors import RunDirInUseError
from recovery.format.layout import step_dir_name

ROOT = Path(__file__).resolve().parents[2]


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def holding(run_dir: Path, *steps: int) -> Path:
    """``run_dir`` with committed-looking step directories: all a listing sees."""
    for step in steps:
        (run_dir / step_dir_name(step)).mkdir(parents=True)
    return run_dir


def the_runs_own_refusal(run_dir: Path) -> str:
    """The message of the check the run makes after it takes the lock (the same function)."""
    from recovery.run.restoring import rundir

    with pytest.raises(RunDirInUseError) as caught:
        rundir.refuse_reuse(run_dir)
    return str(caught.value)


def test_train_py_refuses_from_a_listing_without_importing_torch(tmp_path):
    run_dir = holding(tmp_path / "r", 10, 20)
    done = subprocess.run(  # a fresh interpreter: what train.py itself imports
        [
            sys.executable,
            "-X",
            "importtime",
            "train.py",
            f"checkpoint.root={tmp_path}",
            "run.name=r",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 13, done.stderr[-3000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "recovery.config" in imported, "-X importtime lists the imports"
    assert "torch" not in imported
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {the_runs_own_refusal(run_dir)}"], errors


def test_the_early_refusal_is_the_runs_own_word_for_word(tmp_path):
    import recipes

    run_dir = holding(tmp_path / "r", 7)
    with pytest.raises(RunDirInUseError) as caught:
        recipes.check_start(composed(f"checkpoint.root={tmp_path}", "run.name=r"))
    assert str(caught.value) == the_runs_own_refusal(run_dir)
    assert caught.value.path == run_dir


def test_what_a_listing_cannot_refuse_goes_on(tmp_path):
    import recipes

    root = f"checkpoint.root={tmp_path}"
    recipes.check_start(composed(root, "run.name=absent"))
    (tmp_path / "empty").mkdir()
    recipes.check_start(composed(root, "run.name=empty"))
    holding(tmp_path / "r", 10)
    recipes.check_start(composed(root, "run.name=r", "+resume=latest"))  # a resume: not fresh


def test_a_bad_value_is_still_exit_12_first(tmp_path):
    import recipes
    from recovery.errors import ConfigError

    holding(tmp_path / "r", 10)
    with pytest.raises(ConfigError, match="^train.steps"):
        recipes.check_start(composed(f"checkpoint.root={tmp_path}", "run.name=r", "train.steps=0"))


def test_under_slurm_the_job_named_run_directory_is_the_one_listed(tmp_path, monkeypatch):
    import recipes

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    for key in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    run_dir = holding(tmp_path / "slurm-4242", 10)
    cfg = composed(f"checkpoint.root={tmp_path}")
    with pytest.raises(RunDirInUseError) as caught:
        recipes.check_start(cfg)
    assert str(caught.value) == the_runs_own_refusal(run_dir)
    assert cfg.run.name == "default", "the check writes nothing back; the run names itself"
    recipes.check_start(composed(f"checkpoint.root={tmp_path}", "run.name=other"))
