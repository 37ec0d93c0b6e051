"""DVC experiments on a real copy of the project: ``dvc exp run exp/dvc.yaml -S ...``,
queued and rerun, each its own run that a rerun resumes; ``dvc exp show`` lists them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from recovery import faults
from recovery.format.layout import METRICS_FILE, step_dir_name
from recovery.run import journal
from tests import launcher
from tests.integration.conftest import ROOT, SMALL, STEPS, assert_same_run, console

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]


def sh(cwd: Path, *cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = launcher.run(console(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


@pytest.fixture
def project(tmp_path, signer):
    """A git + DVC copy of the project with its own .dvc/config (Hydra composition on),
    params.yaml and exp/dvc.yaml, the dataset prepared and committed."""
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("train.py", "dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, proj)
    # hydra_plugins: DVC's composition loads the project's Hydra plugins from the root
    for name in ("conf", "recipes", "recovery", "exp", "hydra_plugins"):
        if not (ROOT / name).exists():
            continue
        shutil.copytree(
            ROOT / name,
            proj / name,
            ignore=shutil.ignore_patterns("__pycache__", "metrics.json"),
        )
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
        "RECOVERY_SIGNING_KEY": str(signer.path),
        "PYTHONUNBUFFERED": "1",
    }
    sh(proj, *GIT, "init", "-q", env=env)
    sh(proj, "dvc", "init", "-q", env=env)
    shutil.copy(ROOT / ".dvc" / "config", proj / ".dvc" / "config")  # the project's, as committed
    sh(proj, "dvc", "remote", "add", "-f", "-d", "local", str(tmp_path / "remote"), env=env)
    sh(proj, "dvc", "repro", "prepare", env=env)
    sh(proj, *GIT, "add", "-A", env=env)
    sh(proj, *GIT, "commit", "-qm", "base", env=env)
    return proj, env


def exp_metrics(proj: Path, env: dict[str, str]) -> dict[str, dict]:
    """Experiment name -> its metrics in ``dvc exp show --json``."""
    shown = json.loads(sh(proj, "dvc", "exp", "show", "--json", env=env).stdout)
    return {
        rev["name"]: rev["data"]["metrics"]["exp/metrics.json"]["data"]
        for commit in shown
        for exp in commit.get("experiments") or []
        for rev in exp["revs"]
    }


def resumes(run_dir: Path) -> list[dict]:
    return [r for r in journal.read(run_dir / METRICS_FILE) if r.get("event") == "resume"]


def test_dvc_experiments_train_resume_queue_and_show(project, data_root, reference, trust):
    proj, env = project
    root = proj / "checkpoints" / "exp"
    sets = [f"-S{o}" for o in [*SMALL, f"recipe.data.root={data_root}"]]

    # a workspace experiment, its training killed at step 45 (checkpoint 40 committed)
    mark = proj.parent / "paused.mark"
    pause = {faults.PAUSE_ENV: "step-45", faults.MARK_ENV: str(mark)}
    with open(proj.parent / "a.log", "w") as log:
        run = ["dvc", "exp", "run", "exp/dvc.yaml", "-n", "a", *sets]
        proc = launcher.Popen(console(run), cwd=proj, env={**env, **pause}, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 300
            while not mark.exists():
                assert proc.poll() is None and time.monotonic() < deadline, (
                    proj.parent / "a.log"
                ).read_text()
                time.sleep(0.05)
            os.kill(int(mark.read_text().split()[1]), signal.SIGKILL)  # the training process
            assert proc.wait(timeout=120) != 0  # DVC reports the stage failed
        finally:
            if proc.poll() is None:
                proc.kill()
    assert (root / "a" / step_dir_name(40)).is_dir() and not (
        proj / "exp" / "metrics.json"
    ).exists()
    composed = OmegaConf.load(proj / "params.yaml")  # DVC's composition of conf/ and -S
    assert composed.train.steps == STEPS and composed.recipe.batch_size == 64

    # queued: a new experiment b, and a again; each runs in a temp copy of the workspace
    sh(proj, "dvc", "exp", "run", "exp/dvc.yaml", "--queue", "-n", "b", *sets, "-Sseed=1", env=env)
    sh(proj, "dvc", "exp", "run", "exp/dvc.yaml", "--queue", "-n", "a", *sets, env=env)
    sh(proj, "dvc", "exp", "run", "--run-all", env=env)

    # a resumed where it stopped, exactly: same steps, same final state as the reference
    assert [r["step"] for r in resumes(root / "a")] == [40]
    assert_same_run(reference, root / "a", trust)
    # b: its own run directory, a fresh run with its own seed
    assert (root / "b" / step_dir_name(STEPS)).is_dir() and not resumes(root / "b")
    assert not (proj / "checkpoints" / "default").exists()

    shown = exp_metrics(proj, env)
    assert shown["a"]["step"] == STEPS and shown["a"]["resumes"] == 1
    assert shown["b"]["step"] == STEPS and shown["b"]["resumes"] == 0
    assert shown["a"]["loss"] != shown["b"]["loss"]

    # a plain `dvc repro` never trains: the root dvc.yaml has no train stage
    assert "train" not in sh(proj, "dvc", "stage", "list", env=env).stdout
    assert "train" in sh(proj, "dvc", "stage", "list", "exp/dvc.yaml", env=env).stdout


def test_committed_params_are_the_composition_of_conf(tmp_path):
    """params.yaml is what `dvc exp run` composes from conf/ with no overrides, so a
    `dvc params diff` and `dvc exp show` baseline read the real defaults."""
    from dvc.utils.hydra import compose_and_dump

    out = tmp_path / "params.yaml"
    compose_and_dump(out, str(ROOT / "conf"), None, "config", str(tmp_path), [])
    assert OmegaConf.load(ROOT / "params.yaml") == OmegaConf.load(out), (
        "params.yaml is stale: regenerate it (README.md, DVC experiments)"
    )


def test_the_committed_experiment_lock_is_the_baseline_so_dvc_status_is_clean():
    """exp/dvc.lock records what the stage depends on as committed: params.yaml and the
    prepared data (the hash dvc.lock records for the prepare stage's output), and the
    stage's command: `dvc status` then lists no experiment stage until a param changes."""
    lock = yaml.safe_load((ROOT / "exp" / "dvc.lock").read_text())["stages"]["train"]
    stage = yaml.safe_load((ROOT / "exp" / "dvc.yaml").read_text())["stages"]["train"]
    prepare = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]["prepare"]
    assert lock["cmd"] == stage["cmd"]
    regenerate = "stale exp/dvc.lock: `dvc commit -f exp/dvc.yaml:train` (docs/experiments.md)"
    assert lock["params"]["params.yaml"] == OmegaConf.to_container(
        OmegaConf.load(ROOT / "params.yaml")
    ), regenerate
    data = {d["path"]: d["md5"] for d in lock["deps"]}
    assert data == {o["path"]: o["md5"] for o in prepare["outs"]}, regenerate
    assert "always_changed" not in stage and "outs" not in stage and "metrics" not in stage


def test_the_stage_names_the_run_after_the_experiment_and_anchors_paths(tmp_path):
    """In a temp copy, relative paths are the repository's (DVC_ROOT), and the run resumes."""
    from recipes import experiment

    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    env = {"DVC_EXP_NAME": "lucky-kite", "DVC_ROOT": "/repo"}
    cfg = experiment.configure(params, env)
    assert cfg.run.name == "lucky-kite" and cfg.resume == "latest"
    assert cfg.checkpoint.root == "/repo/checkpoints/exp"
    assert cfg.signing.trusted == "/repo/.recovery/trusted"
    assert experiment.configure(params, {}).run.name == "default"  # `dvc repro` outside exp
    # in the workspace itself (DVC_ROOT is the working directory) paths stay as written
    here = experiment.configure(params, {"DVC_EXP_NAME": "a", "DVC_ROOT": str(Path.cwd())})
    assert here.checkpoint.root == "checkpoints/exp" and here.signing.trusted == ".recovery/trusted"


def test_a_missing_or_foreign_params_file_is_one_line(tmp_path, capsys):
    from recipes import experiment

    assert experiment.main([str(tmp_path / "none.yaml")], {}) == 12
    (tmp_path / "other.yaml").write_text("lr: 1\n")
    assert experiment.main([str(tmp_path / "other.yaml")], {}) == 12
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "cannot read the composed config" in err[0], err
    assert "not a composed config of conf/" in err[1]
