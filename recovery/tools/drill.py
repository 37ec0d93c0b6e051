"""Kill-and-resume drills: prove recovery before a real failure does.

A drill runs the training script as real subprocesses: an uninterrupted
reference to N steps, then a victim started with ``+resume=latest`` and killed
with SIGKILL at K points chosen at random (:mod:`recovery.tools.killpoints`:
between steps; inside each phase of a checkpoint commit: while tensors are
written, before the signature, between the signature and the rename, with
``checkpoint.async=true`` in the background writer; while retention deletes an
old checkpoint; during the best copy; with ``--dvc`` while the publisher
registers, pushes or deletes; and once a branch: a victim started with
``+resume=<older step>`` killed while it moves the later checkpoints to
``abandoned/``), resumed after each kill with ``+resume=latest``, and finally
let run to the end. Then every step's loss, learning rate and batch ids (the
journal's last record of each step: the run that survived, after a branch too),
and the final model and optimizer tensors, are compared at the declared level
(``bitwise``, or ``tolerance`` with atol/rtol for GPU runs).

Preflight (:func:`preflight`) checks one real checkpoint without training:
restoring its data cursor and optimizer must reproduce the step, learning rate
and next batch that the live run recorded when it saved.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from recovery import faults
from recovery.errors import DrillError
from recovery.format.layout import DISTRIBUTED, METRICS_FILE, step_dir_name
from recovery.integrity import reader
from recovery.integrity.signing import TrustStore
from recovery.provenance import purpose
from recovery.run import resume
from recovery.run.journal import effective_steps, read
from recovery.state.sampler import ResumableSampler
from recovery.tools import killpoints

log = logging.getLogger(__name__)

DRILL_FILE = "drill.json"
PLOT_FILE = "drill.png"


@dataclass
class Plan:
    """What a drill runs: the training command, its length and where it checkpoints."""

    script: Path
    overrides: list[str]
    steps: int
    every: int
    out: Path
    env: dict[str, str] = field(default_factory=dict)
    level: str = "bitwise"
    atol: float = 0.0
    rtol: float = 0.0
    dvc: bool = False
    """Drill inside a throwaway git + DVC repository, pushing, with one kill on its publisher."""
    keep_last: int = 3
    keep_every: int = 0
    keep_best: bool = False
    """The run's retention settings (``checkpoint.*``), which decide its kill points."""

    def schedule(self) -> dict[str, Any]:
        """What decides the kill points: the run's length, its saves and what it keeps."""
        keys = ("steps", "every", "keep_last", "keep_every", "keep_best", "dvc")
        return {k: getattr(self, k) for k in keys}


def _train(plan: Plan, root: Path, extra: list[str], *, pause_at: str | None) -> tuple[int, str]:
    """Run the script once; with ``pause_at``, SIGKILL it there. Returns (exit code, point hit)."""
    cmd = [
        sys.executable,
        str(plan.script),
        f"checkpoint.root={root}",
        "run.name=drill",
        *plan.overrides,
        *extra,
    ]
    env = {**os.environ, **plan.env, "PYTHONUNBUFFERED": "1"}
    mark = root / "paused.mark"
    mark.unlink(missing_ok=True)
    if pause_at:
        env[faults.PAUSE_ENV] = pause_at
        env[faults.MARK_ENV] = str(mark)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "drill.log", "a") as logfile:
        proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, env=env)
        if pause_at:
            while not mark.exists() and proc.poll() is None:
                time.sleep(0.02)
            if mark.exists():
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return proc.returncode, pause_at
        return proc.wait(), ""


def flat_tensors(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a state tree, keyed by its path."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(tree, torch.Tensor):
        out[prefix] = tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            out |= flat_tensors(v, f"{prefix}/{k}")
    elif isinstance(tree, list | tuple):
        for i, v in enumerate(tree):
            out |= flat_tensors(v, f"{prefix}/{i}")
    return out


def compare(
    plan: Plan, ref: Path, victim: Path, trust: TrustStore, *, allow_untrusted: bool = False
) -> list[str]:
    """Every difference between two runs at the plan's level, one line each."""
    a, b = effective_steps(ref / METRICS_FILE), effective_steps(victim / METRICS_FILE)
    diffs: list[str] = []
    for step in sorted(a):
        if step not in b:
            diffs.append(f"step {step}: missing from the drilled run")
            continue
        for key in ("batch", "epoch"):
            if a[step][key] != b[step][key]:
                diffs.append(f"step {step}: {key} differs")
        for key in ("loss", "lr"):
            x, y = float(a[step][key]), float(b[step][key])
            ok = x == y if plan.level == "bitwise" else abs(x - y) <= plan.atol + plan.rtol * abs(x)
            if not ok:
                diffs.append(f"step {step}: {key} {x!r} (reference) vs {y!r} (drilled)")
    last = step_dir_name(plan.steps)
    ta = resume.load(ref / last, trust, allow_untrusted=allow_untrusted).decoded.tree
    tb = resume.load(victim / last, trust, allow_untrusted=allow_untrusted).decoded.tree
    for component in ("model", "optimizer"):
        fa, fb = flat_tensors(ta.get(component)), flat_tensors(tb.get(component))
        for key in sorted(fa.keys() | fb.keys()):
            if key not in fa or key not in fb:
                diffs.append(f"final {component}{key}: present in one run only")
                continue
            ta_, tb_ = fa[key], fb[key]
            same = (
                torch.equal(ta_, tb_)
                if plan.level == "bitwise"
                else torch.allclose(ta_.double(), tb_.double(), atol=plan.atol, rtol=plan.rtol)
            )
            if not same:
                worst = (
                    float((ta_.double() - tb_.double()).abs().max())
                    if ta_.shape == tb_.shape
                    else float("nan")
                )
                diffs.append(f"final {component}{key}: differs (max |diff| {worst:.3g})")
    return diffs


@dataclass
class Report:
    """A drill's outcome."""

    passed: bool
    level: str
    kills: list[dict[str, Any]]
    resumes: list[int]
    differences: list[str]
    steps: int
    seconds: float
    plot: str | None = None


def run(
    plan: Plan,
    *,
    kills: int,
    seed: int,
    trust: Callable[[], TrustStore],
    allow_untrusted: bool = False,
) -> Report:
    """Run the reference, the drilled victim (``kills`` kills) and the comparison.

    ``trust`` is called after the runs: on a fresh machine the first run is what
    creates the local dev key that signed them.
    """
    started = time.time()
    rng = random.Random(seed)
    points = killpoints.choose_points(rng, kills=kills, **plan.schedule())
    extra: list[str] = []
    if plan.dvc:
        _dvc_repo(plan.out)
        extra = ["checkpoint.dvc.push=true"]
    else:
        extra = ["checkpoint.dvc.enabled=false"]
    log.info("drill: %d kill points: %s", len(points), ", ".join(points))
    ref_root, vic_root = plan.out / "reference", plan.out / "victim"
    code, _ = _train(plan, ref_root, ["checkpoint.dvc.enabled=false"], pause_at=None)
    if code != 0:
        raise DrillError(
            f"drill: the reference run failed (exit {code}); see {ref_root / 'drill.log'}"
        )
    kill_log: list[dict[str, Any]] = []
    for point in points:
        kill = killpoints.parse(point)
        code, hit = _train(plan, vic_root, [*extra, f"+resume={kill.resume}"], pause_at=kill.fault)
        if not hit:
            kill_log.append({"point": point, "reached": False, "exit": code})
            if code != 0:
                raise DrillError(
                    f"drill: the victim exited {code} before {point}; see {vic_root / 'drill.log'}"
                )
            break
        kill_log.append({"point": point, "reached": True, "exit": code})
    code, _ = _train(plan, vic_root, [*extra, "+resume=latest"], pause_at=None)
    if code != 0:
        raise DrillError(
            f"drill: the final resume failed (exit {code}); see {vic_root / 'drill.log'}"
        )
    ref_run, vic_run = ref_root / "drill", vic_root / "drill"
    diffs = compare(plan, ref_run, vic_run, trust(), allow_untrusted=allow_untrusted)
    resumes = [int(r["step"]) for r in read(vic_run / METRICS_FILE) if r.get("event") == "resume"]
    unreached = [k["point"] for k in kill_log if not k["reached"]]
    if unreached:
        diffs.append(f"kill points never reached: {unreached}")
    if plan.dvc:
        diffs += _dvc_complete(vic_run)
    report = Report(
        passed=not diffs,
        level=plan.level,
        kills=kill_log,
        resumes=resumes,
        differences=diffs,
        steps=plan.steps,
        seconds=time.time() - started,
    )
    try:
        report.plot = str(_plot(plan, ref_run, vic_run, report))
    except ImportError as err:  # the verdict stands without its picture
        log.warning("drill: no plot (%s); pip install 'recovery[plot]' for drill.png", err)
    (plan.out / DRILL_FILE).write_text(json.dumps(asdict(report), indent=1))
    return report


def _dvc_repo(out: Path) -> None:
    """Make ``out`` a throwaway git + DVC repository with a local default remote."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    dvc = str(Path(sys.executable).with_name("dvc"))
    for cmd in (
        ["git", "init", "-q"],
        [dvc, "init", "-q"],
        [dvc, "config", "core.analytics", "false"],
        [dvc, "config", "cache.type", "hardlink,symlink"],
        [dvc, "remote", "add", "-d", "local", str(out / "remote")],
    ):
        subprocess.run(cmd, cwd=out, env=env, check=True, capture_output=True)


def _dvc_complete(run_dir: Path) -> list[str]:
    """After the drill, every committed checkpoint must be registered and pushed (after a sync)."""
    from recovery.format.layout import scan
    from recovery.storage import tracking

    root = tracking.find_repo(run_dir)
    if root is None:
        return [f"{run_dir}: not inside the drill's DVC repository"]
    publisher = tracking.Publisher(root, push=True)
    state = tracking.status(run_dir)
    for _, path in scan(run_dir).committed:
        if not (state.get(path.name) and state[path.name].pushed):
            publisher.submit(path)  # what a kill left pending: `recovery sync` does the same
    publisher.close(120)
    state = tracking.status(run_dir)
    return [
        f"{path.name}: not registered and pushed after a sync"
        for _, path in scan(run_dir).committed
        if not (state.get(path.name) and state[path.name].pushed)
    ]


def _plot(plan: Plan, ref: Path, victim: Path, report: Report) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a, b = effective_steps(ref / METRICS_FILE), effective_steps(victim / METRICS_FILE)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = sorted(a)
    ax.plot(xs, [a[s]["loss"] for s in xs], label="reference (uninterrupted)", lw=2.5, alpha=0.6)
    ys = sorted(b)
    ax.plot(ys, [b[s]["loss"] for s in ys], label="drilled (killed and resumed)", lw=1, ls="--")
    for i, k in enumerate(report.kills):
        if k["reached"]:
            step = killpoints.parse(k["point"]).step
            ax.axvline(step, color="red", alpha=0.5, lw=1, label="SIGKILL" if i == 0 else None)
    for i, step in enumerate(report.resumes):
        ax.axvline(step, color="green", alpha=0.5, lw=1, ls=":", label="resume" if i == 0 else None)
    verdict = "PASS" if report.passed else f"FAIL ({len(report.differences)} differences)"
    ax.set_title(
        f"kill-and-resume drill: {len(report.kills)} kills, level {report.level}: {verdict}"
    )
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend()
    path = plan.out / PLOT_FILE
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def preflight(path: Path, trust: TrustStore) -> dict[str, Any]:
    """Restore a checkpoint's cursor and optimizer; compare with what the live run recorded.

    Raises:
        PurposeError: ``path`` is no continuation checkpoint (an inference artifact).
        DrillError: the restored step, learning rate or next batch differs, naming each.
    """
    # its purpose first, from the signed statement alone: an inference artifact has no
    # training state to decode, and that is the refusal, not a failed drill
    mf = reader.read_manifest(path, trust)
    purpose.check_use(purpose.RESUME, mf.purpose, where=str(path))
    loaded = resume.load(path, trust)
    expect = loaded.decoded.meta.get("expect")
    if not expect:
        raise DrillError(f"{path}: records no expectations (written before preflight existed)")
    tree = loaded.decoded.tree
    problems = []
    if loaded.decoded.step != expect["step"]:
        problems.append(f"step: restored {loaded.decoded.step}, recorded {expect['step']}")
    # a torchrun checkpoint keeps its optimizer's param groups beside its DCP shards
    groups = tree.get("optimizer", {}).get("param_groups") or loaded.decoded.meta.get(
        DISTRIBUTED, {}
    ).get("optimizer", {}).get("param_groups", [])
    lrs = [float(g["lr"]) for g in groups]
    if lrs != expect.get("lr"):
        problems.append(f"learning rate: restored {lrs}, recorded {expect.get('lr')}")
    cursor = tree.get("sampler")
    if cursor is not None:
        sampler = ResumableSampler(
            cursor["num_examples"],
            cursor["batch_size"],
            cursor["seed"],
            drop_last=cursor["drop_last"],
        )
        sampler.load_state_dict(cursor)
        _, ids = sampler.next_batch()
        if ids.tolist() != expect.get("next_batch"):
            problems.append(
                f"next batch: restored {ids.tolist()[:8]}..., "
                f"recorded {list(expect.get('next_batch') or [])[:8]}..."
            )
    if problems:
        raise DrillError(f"{path}: preflight failed:\n  " + "\n  ".join(problems), path=path)
    return {
        "path": str(path),
        "step": loaded.decoded.step,
        "lr": lrs,
        "next_batch_size": len(expect.get("next_batch") or []),
    }
