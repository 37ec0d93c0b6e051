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

import logging
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.errors import DrillError
from recovery.format.layout import DISTRIBUTED, METRICS_FILE, step_dir_name
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import reader
from recovery.provenance import purpose
from recovery.run.restoring import choose
from recovery.state.sampler import ResumableSampler
from recovery.tools import killpoints
from recovery.tools.drill.pace import Pace, Say
from recovery.tools.drill.runs import Ran, launch, never_reached, victims
from recovery.tools.drill.verdict import DRILL_FILE as DRILL_FILE
from recovery.tools.drill.verdict import PLOT_FILE as PLOT_FILE
from recovery.tools.drill.verdict import Level, Report, compare_final, compare_steps, conclude
from recovery.tools.drill.verdict import flat_tensors as flat_tensors
from recovery.tools.drill.verdict import plot as _plot

log = logging.getLogger(__name__)

SHORT_RUN = ("train.steps=120", "checkpoint.every_steps=20")
"""The drilled run when the overrides set neither its length nor its interval: six
checkpoints, room for every kind of kill point (each commit phase, a retention deletion,
a branch, step boundaries) in a drill of about two minutes on two cores. The script's
own length (``train.steps=1200``) drills the same code over more steps: pass it."""


def short_run(overrides: list[str]) -> list[str]:
    """``overrides`` after :data:`SHORT_RUN`, unless they set ``train.steps`` or
    ``checkpoint.every_steps`` themselves (then as given)."""
    keys = {o.split("=", 1)[0] for o in SHORT_RUN}
    if any(o.lstrip("+~").split("=", 1)[0] in keys for o in overrides):
        return overrides
    return [*SHORT_RUN, *overrides]


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
    full_every: int = 0
    """With ``checkpoint.differential.enabled``: its ``full_every`` (which saves are bases,
    which retention keeps for their deltas); 0: off."""
    chained: bool = False
    """With differential saves: each delta's base is the save before it (``against:
    previous``), so retention keeps whole chains."""
    timeout_s: float | None = None
    """How long one run may take before the drill kills it and gives up (``None``: no limit)."""

    @property
    def judged(self) -> Level:
        """The comparison level the plan declares."""
        return Level(self.level, self.atol, self.rtol)

    def schedule(self) -> dict[str, Any]:
        """What decides the kill points: the run's length, its saves and what it keeps."""
        keys = ("steps", "every", "keep_last", "keep_every", "keep_best", "dvc", "full_every")
        return {k: getattr(self, k) for k in (*keys, "chained")}


def _train(plan: Plan, root: Path, extra: list[str], *, pause_at: str | None) -> Ran:
    """Run the script once; with ``pause_at``, SIGKILL it there.

    Raises:
        RecoveryError: it ran longer than the plan's ``timeout_s``.
    """
    cmd = [
        sys.executable,
        str(plan.script),
        f"checkpoint.root={root}",
        "run.name=drill",
        *plan.overrides,
        *extra,
    ]
    env = {**os.environ, **plan.env, "PYTHONUNBUFFERED": "1"}
    return launch(
        cmd, env=env, root=root, pause_at=pause_at, timeout_s=plan.timeout_s, what=plan.script.name
    )


def compare(
    plan: Plan, ref: Path, victim: Path, trust: TrustStore, *, allow_untrusted: bool = False
) -> list[str]:
    """Every difference between two runs at the plan's level, one line each."""
    diffs = compare_steps(ref, victim, plan.judged, keys=("batch", "epoch", "loss", "lr"))
    last = step_dir_name(plan.steps)
    return diffs + compare_final(
        ref / last, victim / last, trust, plan.judged, allow_untrusted=allow_untrusted
    )


def run(
    plan: Plan,
    *,
    kills: int,
    seed: int,
    trust: Callable[[], TrustStore],
    allow_untrusted: bool = False,
    say: Say | None = None,
) -> Report:
    """Run the reference, the drilled victim (``kills`` kills) and the comparison.

    ``trust`` is called after the runs: on a fresh machine the first run is what
    creates the local dev key that signed them. ``say``: where each run and kill is
    told as it ends, with the time left (:class:`~recovery.tools.drill.pace.Pace`).
    """
    started = time.time()
    rng = random.Random(seed)
    points = killpoints.choose_points(rng, kills=kills, **plan.schedule())
    extra: list[str] = []
    if plan.dvc:
        dvc_repo(plan.out)
        extra = ["checkpoint.dvc.push=true"]
    else:
        extra = ["checkpoint.dvc.enabled=false"]
    log.info("drill: %d kill points: %s", len(points), ", ".join(points))
    ref_root, vic_root = plan.out / "reference", plan.out / "victim"
    ref_run, vic_run = ref_root / "drill", vic_root / "drill"
    pace = Pace(say)
    pace.plan(points, killpoints.commit_steps(plan.steps, plan.every), plan.steps)
    pace.start(plan.steps)
    alone = ["checkpoint.dvc.enabled=false"]
    ran = pace.timed(ref_run / METRICS_FILE, lambda: _train(plan, ref_root, alone, pause_at=None))
    if ran.code != 0:
        raise DrillError(
            f"drill: the reference run failed (exit {ran.code}); see {ref_root / 'drill.log'}"
        )
    pace.reference(plan.steps)

    def victim(kill: killpoints.Kill) -> Ran:
        again = [*extra, f"+resume={kill.resume}"]
        return pace.timed(
            vic_run / METRICS_FILE, lambda: _train(plan, vic_root, again, pause_at=kill.fault)
        )

    def failed(point: str, ran: Ran) -> DrillError:
        return DrillError(
            f"drill: the victim exited {ran.code} before {point}; see {vic_root / 'drill.log'}"
        )

    kill_log = victims(points, victim, failed, pace.victim)
    latest = [*extra, "+resume=latest"]
    ran = pace.timed(vic_run / METRICS_FILE, lambda: _train(plan, vic_root, latest, pause_at=None))
    if ran.code != 0:
        raise DrillError(
            f"drill: the final resume failed (exit {ran.code}); see {vic_root / 'drill.log'}"
        )
    pace.last()
    diffs = compare(plan, ref_run, vic_run, trust(), allow_untrusted=allow_untrusted)
    diffs += never_reached(kill_log)
    if plan.dvc:
        diffs += _dvc_complete(vic_run)
    return conclude(
        plan.out,
        ref_run,
        vic_run,
        level=plan.level,
        kills=kill_log,
        differences=diffs,
        steps=plan.steps,
        started=started,
        draw=_plot,  # looked up now: a test replaces it
    )


def dvc_repo(out: Path) -> None:
    """Make ``out`` a throwaway git + DVC repository with a local default remote
    (``out/remote``): the drill's ``--dvc`` and ``make bench-diff --dvc`` use it."""
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
    loaded = choose.load(path, trust)
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
