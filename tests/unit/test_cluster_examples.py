"""The preemption exit code (``checkpoint.preempt_exit_code``) and the cluster examples that
depend on it: each manifest parses, has the structure its scheduler needs, and retries
exactly the exit code its command makes a preempted run exit with."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from recovery.config import CheckpointConfig, typed
from recovery.config.checks import OWN_EXIT_CODES
from recovery.errors import ConfigError, Preempted
from recovery.exitcodes import EXIT_CODES, exit_code
from tests.unit.test_docs import check_train_py

TOP = Path(__file__).resolve().parents[2]
EXAMPLES = TOP / "examples"
KEY = "checkpoint.preempt_exit_code"
DEFAULT = 75


def checkpoint_config(overrides: list[str]) -> CheckpointConfig:
    """``checkpoint`` as ``python train.py <overrides>`` composes and validates it."""
    with initialize_config_dir(config_dir=str(TOP / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    return typed(CheckpointConfig, cfg.checkpoint, key="checkpoint")


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        (75, True),  # EX_TEMPFAIL, the default
        (143, True),  # 128 + SIGTERM: Kubeflow's ExitCode policy retries it
        (32, True),
        (255, True),
        (0, False),  # success
        (1, False),  # recovery's own codes, 1-31
        (2, False),
        (12, False),
        (30, False),
        (31, False),
        (256, False),  # no exit status
        (-1, False),
        (True, False),
        ("143", False),
        (75.0, False),
        (None, False),
    ],
)
def test_the_preempt_exit_code_is_validated_at_start_up(value, accepted):
    if accepted:
        assert CheckpointConfig(preempt_exit_code=value).preempt_exit_code == value
        return
    with pytest.raises(ConfigError) as refused:
        CheckpointConfig(preempt_exit_code=value)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{KEY}: expected an integer exit code")
    assert f"got {value!r}" in line and line.endswith(f"set e.g. {KEY}=75")


def test_the_command_line_sets_it_and_a_bad_one_is_refused():
    assert checkpoint_config([]).preempt_exit_code == DEFAULT
    assert checkpoint_config([f"{KEY}=143"]).preempt_exit_code == 143
    with pytest.raises(ConfigError, match=f"^{KEY}: .*got 12;"):
        checkpoint_config([f"{KEY}=12"])


def test_no_error_of_recovery_exits_with_a_code_a_preemption_may_use():
    own = {code for cls, code, _ in EXIT_CODES if cls is not Preempted} | {2}  # 2: usage
    assert own <= set(OWN_EXIT_CODES)
    assert DEFAULT not in OWN_EXIT_CODES
    preempted = Preempted("SIGTERM", step=3, signal_name="SIGTERM", exit_status=143)
    assert exit_code(preempted) == 143
    assert exit_code(Preempted("SIGTERM", step=3, signal_name="SIGTERM")) == DEFAULT


def train_command(argv: list[str], where: str) -> list[str]:
    """The overrides of a ``python train.py ...`` command, checked by train.py's preflight
    and validated by the checkpoint schema."""
    assert argv[:2] == ["python", "train.py"], f"{where}: {argv}"
    overrides = argv[2:]
    check_train_py(where, overrides)
    assert "+resume=latest" in overrides, f"{where}: a requeue must resume"
    assert any(o.startswith("run.name=") for o in overrides), f"{where}: a fixed run name"
    checkpoint_config(overrides)  # every value valid, not only every key
    return overrides


def preempt_code(overrides: list[str]) -> int:
    return checkpoint_config(overrides).preempt_exit_code


def manifest(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / "kubernetes" / name).read_text())


def test_the_job_ignores_exactly_the_preemption_exit_code():
    job = manifest("job.yaml")
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert spec["podReplacementPolicy"] == "Failed" and spec["backoffLimit"] >= 1
    (container,) = pod["containers"]
    code = preempt_code(train_command(container["command"], "job.yaml"))
    rules = spec["podFailurePolicy"]["rules"]
    by_code = [r for r in rules if "onExitCodes" in r]
    for rule in by_code:
        assert rule["onExitCodes"]["containerName"] == container["name"]
        assert rule["onExitCodes"]["operator"] == "In"
    ignored = [r["onExitCodes"]["values"] for r in by_code if r["action"] == "Ignore"]
    assert ignored == [[code]]
    assert rules[0]["action"] == "Ignore" and rules[0]["onExitCodes"]["values"] == [code]
    ignoring = [r for r in rules if r["action"] == "Ignore"]
    conditions = [c["type"] for r in ignoring for c in r.get("onPodConditions", [])]
    assert conditions == ["DisruptionTarget"]
    (failing,) = [r["onExitCodes"]["values"] for r in by_code if r["action"] == "FailJob"]
    assert 12 in failing and set(failing) <= set(OWN_EXIT_CODES) and code not in failing
    assert pod["terminationGracePeriodSeconds"] >= 30  # time for a step and a checkpoint


def test_the_pytorchjob_exits_a_code_its_exit_code_policy_retries():
    job = manifest("pytorchjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert job["spec"]["runPolicy"]["backoffLimit"] >= 1
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert "Master" in replicas
    for role, replica in replicas.items():
        assert replica["restartPolicy"] == "ExitCode", role
        (container,) = replica["template"]["spec"]["containers"]
        assert container["name"] == "pytorch", role  # the training operator's name
        overrides = train_command(container["command"], f"pytorchjob.yaml {role}")
        assert 128 <= preempt_code(overrides) <= 255, role  # 1-127: permanent there
        assert f"{KEY}=143" in overrides


def test_the_sbatch_script_requeues_the_code_its_command_exits():
    text = (EXAMPLES / "slurm" / "train.sbatch").read_text()
    assert re.search(r"^#SBATCH --requeue$", text, re.M)
    joined = text.replace("\\\n", " ")
    (line,) = [ln for ln in joined.splitlines() if re.search(r"^[^#\s].* train\.py \+", ln)]
    argv = shlex.split(line)
    overrides = [
        a.replace("${run}", "slurm-1")
        for a in argv[argv.index("train.py") + 1 :]
        if a not in ("$@", "&")
    ]
    check_train_py("train.sbatch", overrides)
    code = preempt_code(overrides)
    assert code == DEFAULT  # SLURM retries any code: the default, as RequeueExit=75 expects
    assert re.findall(r'"\$rc" -eq (\d+)', text) == [str(code)]
