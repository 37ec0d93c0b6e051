"""Real ``train.py`` processes on a tiny embedding run, killed with real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch

from recovery import faults
from recovery.format.layout import METRICS_FILE, step_dir_name
from recovery.integrity.keys.trust import KEY_ENV
from recovery.run.journal import effective_steps
from recovery.run.restoring import choose
from recovery.tools.drill import flat_tensors
from tests import launcher
from tests.conftest import once

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "train.py"
STEPS = 80
# 2000 examples / 64 = 32 batches an epoch (the last one 16): steps 1-32 are epoch 0,
# 33-64 epoch 1, 65-80 epoch 2. Checkpoints every 10 steps.
SMALL = [
    "recipe.data.num_users=200",
    "recipe.data.num_items=100",
    "recipe.data.num_interactions=2000",
    "recipe.data.shards=2",
    "recipe.batch_size=64",
    "recipe.optim.warmup_steps=10",
    f"train.steps={STEPS}",
    "train.log_every=20",
    "checkpoint.every_steps=10",
    "checkpoint.keep_last=3",
    "run.name=r",
]
SMALL_DATA = {
    k.split(".")[-1]: int(v)
    for k, v in (o.split("=") for o in SMALL)
    if k.startswith("recipe.data.")
}


def torchrun(nproc: int | None) -> list[str]:
    """The interpreter arguments that start ``nproc`` ranks under torchrun (none: one process)."""
    if not nproc:
        return []
    return ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/integration is marked ``integration`` (so that ``make
    test-fast`` can select by marker: the unit tests and the ``key`` integration tests)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@dataclass
class Result:
    returncode: int
    output: str
    run_dir: Path


@pytest.fixture(scope="session")
def data_root(shared_dir):
    """SMALL's interaction log, generated once for the session (every worker reads it;
    none regenerates it, which would replace it under another worker's run)."""
    from recipes.data import DataConfig, generate

    def make(where: Path) -> None:
        generate(DataConfig(root=str(where / "interactions"), **SMALL_DATA))

    return once(shared_dir / "data", make) / "interactions"


@pytest.fixture
def trainer(data_root, signer):
    """``trainer(root, *overrides, pause_at=None)`` runs train.py; with ``pause_at`` it is
    SIGKILLed when it reaches that :mod:`recovery.faults` point, or, with ``signals``,
    sent those signals there, ``signal_gap`` seconds apart, and then released to handle
    them. Runs sign with the session's test key (``dev_key=True``: with the auto-made dev
    key instead)."""

    def run(
        root: Path,
        *overrides: str,
        pause_at: str | None = None,
        timeout: float = 180,
        dev_key: bool = False,
        cwd: Path | None = None,
        script: Path = TRAIN,
        data: Path | None = None,
        signals: tuple[int, ...] = (),
        signal_gap: float = 0.2,
        before_kill: Callable[[], None] | None = None,
        env_extra: dict[str, str] | None = None,
        nproc: int | None = None,
        kill_marked_rank: bool = False,
    ) -> Result:
        root.mkdir(parents=True, exist_ok=True)
        # nproc: a torchrun job (its own session, so a kill reaches every rank);
        # kill_marked_rank: SIGKILL only the rank that reached pause_at, not the job
        cmd = [
            sys.executable,
            *torchrun(nproc),
            str(script),
            f"checkpoint.root={root}",
            f"recipe.data.root={data or data_root}",
            *SMALL,
            *overrides,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop(KEY_ENV, None)
        env.update(env_extra or {})
        if not dev_key:
            env[KEY_ENV] = str(signer.path)
        mark = root / "paused.mark"
        mark.unlink(missing_ok=True)
        (root / "release").unlink(missing_ok=True)
        if pause_at:
            env[faults.PAUSE_ENV] = pause_at
            env[faults.MARK_ENV] = str(mark)
            if signals:
                env[faults.RELEASE_ENV] = str(root / "release")
        log_path = root / f"train-{time.monotonic_ns()}.log"
        with open(log_path, "w") as log:
            proc = launcher.Popen(
                cmd,
                cwd=cwd or root,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=bool(nproc),
            )
            deadline = time.monotonic() + timeout
            if pause_at:
                while not mark.exists():
                    if proc.poll() is not None:
                        pytest.fail(
                            f"train.py exited ({proc.returncode}) before reaching {pause_at}:\n"
                            + log_path.read_text()
                        )
                    if time.monotonic() > deadline:
                        proc.kill()
                        pytest.fail(f"train.py never reached {pause_at}")
                    time.sleep(0.02)
                if signals:
                    # deliver the signals while it is paused, then let it go on
                    for sig in signals:
                        os.kill(proc.pid, sig)
                        time.sleep(signal_gap)
                    (root / "release").touch()
                else:
                    if before_kill is not None:
                        before_kill()
                    if kill_marked_rank:
                        os.kill(int(mark.read_text().split()[1]), signal.SIGKILL)
                    elif nproc:  # torchrun starts each rank in a session of its own
                        for child in psutil.Process(proc.pid).children(recursive=True):
                            child.kill()
                        proc.kill()
                    else:
                        os.kill(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()  # a hung torchrun job must not outlive its test
                proc.kill()
                raise
        return Result(proc.returncode, log_path.read_text(), root / "r")

    return run


def uninterrupted(root: Path, data_root: Path, signer, *extra: str, nproc: int | None = None):
    """train.py on SMALL (with ``extra``; ``nproc``: under torchrun) in ``root``, to STEPS."""
    cmd = [
        sys.executable,
        *torchrun(nproc),
        str(TRAIN),
        f"checkpoint.root={root}",
        f"recipe.data.root={data_root}",
        *SMALL,
        *extra,
    ]
    env = {**os.environ, KEY_ENV: str(signer.path)}
    done = launcher.run(cmd, cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="session")
def reference(shared_dir, data_root, signer):
    """Run A: the uninterrupted run to STEPS (run once for the session, every worker
    reads it; a test that changes it copies it first)."""
    return once(shared_dir / "reference", lambda root: uninterrupted(root, data_root, signer)) / "r"


def console(cmd: tuple[str, ...] | list[str]) -> list[str]:
    """``cmd`` with ``dvc``, ``recovery`` or ``python`` named by the venv's, so that the
    launcher can fork it (the script a search of PATH finds first where the venv's bin
    leads PATH, as the DVC tests set it)."""
    head, *rest = cmd
    bin_dir = Path(sys.executable).parent
    known = ("dvc", "recovery", "python")
    return [str(bin_dir / head), *rest] if head in known else [head, *rest]


def recovery_export(overrides: list[str], signer) -> subprocess.CompletedProcess[str]:
    """``recovery export`` with ``overrides``, from the project root, signing with ``signer``."""
    return launcher.run(
        [str(Path(sys.executable).with_name("recovery")), "export", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, KEY_ENV: str(signer.path)},
        timeout=300,
    )


def final_state(run_dir: Path, trust) -> dict:
    return choose.load(run_dir / step_dir_name(STEPS), trust).decoded.tree


def assert_same_run(reference: Path, run_dir: Path, trust) -> None:
    """Every step's loss, lr, epoch and batch ids, and the final state, bit-identical."""
    ref = effective_steps(reference / METRICS_FILE)
    got = effective_steps(run_dir / METRICS_FILE)
    assert sorted(ref) == list(range(1, STEPS + 1))
    assert sorted(got) == sorted(ref)
    for step in ref:
        for key in ("loss", "lr", "epoch", "batch"):
            assert got[step][key] == ref[step][key], f"step {step}: {key} differs"
    a, b = final_state(reference, trust), final_state(run_dir, trust)
    assert a.keys() == b.keys()
    optimizers = [name for name in ("optimizer", "sparse_optimizer") if name in a]
    for component in ("model", *optimizers):
        flat_a, flat_b = flat_tensors(a[component]), flat_tensors(b[component])
        assert flat_a.keys() == flat_b.keys()
        for key in flat_a:
            assert torch.equal(flat_a[key], flat_b[key]), f"{component} {key} differs"
    assert a["sampler"] == b["sampler"] and a["scheduler"] == b["scheduler"]
    assert a.get("sparse_scheduler") == b.get("sparse_scheduler")
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])


def run_killed_at(
    cmd: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    pause_at: str | None,
    profile: str = "full",
) -> tuple[int, str]:
    """Run ``cmd``; with ``pause_at``, SIGKILL it once it reaches that fault point
    (``profile``: the launcher's, see :mod:`tests.launcher`).

    Returns its exit status (``-SIGKILL`` when killed) and its output.
    """
    mark = cwd / f"paused-{os.getpid()}-{time.monotonic_ns()}.mark"
    if pause_at:
        env = {**env, faults.PAUSE_ENV: pause_at, faults.MARK_ENV: str(mark)}
    proc = launcher.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        profile=profile,
    )
    if pause_at:
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()  # type: ignore[union-attr]
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        mark.unlink()
    out, _ = proc.communicate(timeout=180)
    return proc.returncode, out


@pytest.fixture(scope="session")
def job(shared_dir, data_root, signer, request):
    """``job(strategy, nproc)``: the uninterrupted torchrun run to STEPS (run once per key
    for the whole session, every worker reading it: the reference of the distributed,
    async and elastic tests); ``job(None, 1, seed=S)``: an uninterrupted single-process
    run with seed S (seed 0: the reference run itself). A test that changes one copies it."""

    def run(strategy, nproc, *, seed=0):
        if strategy is None and seed == 0:
            return request.getfixturevalue("reference")  # SMALL, seed 0 by default

        def make(root: Path) -> None:
            dist = [f"dist.strategy={strategy}"] if strategy else []
            uninterrupted(
                root, data_root, signer, f"seed={seed}", *dist, nproc=nproc if strategy else None
            )

        return once(shared_dir / f"job-{strategy}-{nproc}-{seed}", make) / "r"

    return run
