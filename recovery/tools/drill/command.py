"""``recovery drill -- CMD ...``: the kill-and-resume drill of any command that trains
with the library (a plain loop, not the project's ``train.py``).

The contract a drilled command keeps:

- it trains into the run directory given by the literal ``{run_dir}`` in its
  arguments (substituted per role: the reference's, the victim's);
- it resumes by itself: run again after a kill, it restores ``"latest"``
  (``ckpt.restore(state, "latest")``, a fresh start when nothing is there);
- its Checkpointer writes the journal ``{run_dir}/metrics.jsonl`` with one record
  per step (``journal.write({"step": step, "loss": ..., ...})``) and it calls
  ``ckpt.maybe_save`` after every step and ``ckpt.close()`` at the end;
- it checkpoints on a step cadence (``every_steps``; a clock-based interval commits at
  other steps after each kill, so there is nothing fixed to kill or compare).

The drill runs the command once uninterrupted (the reference), reads from its journal
where it committed and what retention deleted, and draws the kill points from that
(:func:`recovery.tools.killpoints.choose_observed`): the three commit phases
(``commit-write-C``, ``commit-before-manifest-C``, ``commit-before-rename-C``), one
retirement (``retire-N@C``, unless the run directory is inside a DVC repository, where
retention may run on the publisher's thread), then step boundaries (``step-N``, after
``maybe_save`` of step N). Not drawn: a branch (it needs ``+resume=<step>``, which a
command has no flag for), the best copy and the DVC publisher (their settings are the
command's, unseen). The victim, in a session of its own, is killed with SIGKILL at
each point (every process of the command), run again after each kill, and let run to
the end; then every field of every step's record and the final checkpoints' model and
optimizer tensors are compared bitwise (:mod:`recovery.tools.drill.verdict`).

A command that fails by itself (a nonzero exit the drill did not cause) or runs past
the time limit is an error naming the run and the end of its stderr, never a
difference.
"""

from __future__ import annotations

import logging
import os
import random
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from recovery import faults
from recovery.errors import ConfigError
from recovery.format.layout import METRICS_FILE, step_dir_name
from recovery.integrity.keys.signing import TrustStore
from recovery.run.journal import effective_steps, read
from recovery.storage import tracking
from recovery.tools import killpoints
from recovery.tools.drill.pace import Pace, Say
from recovery.tools.drill.runs import Ran, failure, launch, never_reached, victims
from recovery.tools.drill.verdict import Level, Report, compare_final, compare_steps, conclude

log = logging.getLogger(__name__)

RUN_DIR = "{run_dir}"
"""The placeholder a drilled command's arguments name its run directory with."""
RUN = "run"
"""The run directory's name under each role's folder (``reference/run``, ``victim/run``)."""


@dataclass
class CommandPlan:
    """What a command drill runs."""

    command: list[str]
    """The program and its arguments, ``{run_dir}`` in at least one of them."""
    out: Path
    """Where the two runs, ``drill.json`` and ``drill.png`` go."""
    env: dict[str, str] = field(default_factory=dict)
    """Added to the drill's own environment for every run."""
    timeout_s: float = 1800.0
    """How long one run may take before it is killed and the drill gives up."""
    level: Level = field(default_factory=Level)


def check_command(command: Sequence[str]) -> None:
    """Refuse a command the drill cannot point at a run directory.

    Raises:
        ConfigError: it is empty, or no argument holds ``{run_dir}``.
    """
    if not command:
        raise ConfigError("drill: no command after --: recovery drill -- CMD ... {run_dir} ...")
    if not any(RUN_DIR in arg for arg in command):
        raise ConfigError(
            f"drill: the command {shlex.join(command)!r} has no {RUN_DIR} argument: the drill "
            f"gives each run its own run directory, e.g. --run-dir {RUN_DIR}"
        )


def substitute(command: Sequence[str], run_dir: Path) -> list[str]:
    """``command`` with every ``{run_dir}`` replaced by ``run_dir``."""
    return [arg.replace(RUN_DIR, str(run_dir)) for arg in command]


@dataclass(frozen=True)
class Watched:
    """What the uninterrupted run did, as its journal recorded it."""

    steps: int
    """Its last step (that of its final checkpoint)."""
    commits: list[int]
    """The steps it committed checkpoints of, in order."""
    retires: list[tuple[int, int]]
    """(N, C): retention deleted step N's checkpoint in the commit of C."""


def watch(run_dir: Path) -> Watched:
    """Read what a finished run did from its journal.

    Raises:
        ConfigError: it wrote no per-step record, checkpoints on a clock, or left no
            checkpoint of its last step.
    """
    journal = run_dir / METRICS_FILE
    steps = effective_steps(journal) if journal.exists() else {}
    if not steps:
        raise ConfigError(
            f"drill: the command wrote no per-step record to {journal}: give its Checkpointer "
            "journal=Journal(run_dir / 'metrics.jsonl') and write one record per step "
            "(journal.write({'step': step, 'loss': ...}))"
        )
    records = read(journal)
    for r in records:
        interval = r.get("interval") if r.get("event") == "run_summary" else None
        if interval and (interval.get("mode") == "auto" or interval.get("every_seconds")):
            raise ConfigError(
                f"drill: the command checkpoints on a clock ({interval}): after a kill it "
                "would commit at other steps; drill it with CheckpointConfig(every_steps=N) alone"
            )
    commits: list[int] = []
    retires: list[tuple[int, int]] = []
    pending: list[int] = []
    for r in records:
        # retention records what it deleted just before the commit's own record
        if r.get("event") == "retired":
            pending += [int(n) for n in r.get("steps", [])]
        elif r.get("event") == "checkpoint":
            commits.append(int(r["step"]))
            retires += [(n, int(r["step"])) for n in pending]
            pending = []
    last = max(steps)
    if not (run_dir / step_dir_name(last)).is_dir():
        raise ConfigError(
            f"drill: the command's last step {last} has no checkpoint in {run_dir}: give its "
            f"Checkpointer final_step={last} and call ckpt.close() at the end"
        )
    return Watched(steps=last, commits=commits, retires=retires)


def run(
    plan: CommandPlan,
    *,
    kills: int,
    seed: int,
    trust: Callable[[], TrustStore],
    allow_untrusted: bool = False,
    say: Say | None = None,
) -> Report:
    """Drill ``plan.command``: the reference, the victim killed at ``kills`` points, the verdict.

    ``trust`` is called after the runs (the first run may be what creates the dev key).
    ``say``: where each run and kill is told as it ends, with the time left.

    Raises:
        ConfigError: no ``{run_dir}`` in the command, a run it cannot drill (see
            :func:`watch`), or ``kills`` more than its kill points.
        RecoveryError: a run failed by itself or ran past ``plan.timeout_s`` (exit 1).
    """
    check_command(plan.command)
    if kills < 0:  # the most it holds is known only once the reference has run
        raise ConfigError(f"drill --kills: expected 0 or more, got {kills}")
    started = time.time()
    shown = shlex.join(plan.command)
    # a kill point armed in the drill's own environment would stop the reference too
    base = {k: v for k, v in os.environ.items() if k not in (faults.PAUSE_ENV, faults.MARK_ENV)}
    env = {**base, **plan.env, "PYTHONUNBUFFERED": "1"}
    ref_root, vic_root = plan.out / "reference", plan.out / "victim"
    ref_run, vic_run = ref_root / RUN, vic_root / RUN

    def once(root: Path, run_dir: Path, what: str, pause_at: str | None) -> Ran:
        cmd = substitute(plan.command, run_dir)
        return launch(
            cmd,
            env=env,
            root=root,
            pause_at=pause_at,
            timeout_s=plan.timeout_s,
            own_stderr=True,
            group=True,
            what=f"{what} of {shown}",
        )

    pace = Pace(say)
    pace.start(None)  # its length is known once it has run
    ran = pace.timed(
        ref_run / METRICS_FILE, lambda: once(ref_root, ref_run, "the reference run", None)
    )
    if ran.code != 0:
        raise failure(f"the reference run of {shown} (before any kill)", ran, ref_root)
    seen = watch(ref_run)
    dvc = tracking.find_repo(plan.out)
    if dvc is not None:
        log.warning(
            "drill: %s is inside the DVC repository %s: a Checkpointer with DVC enabled (the "
            "default) registers the drill's checkpoints there and deletes on its background "
            "thread, so no retirement is killed; use --out outside it",
            plan.out,
            dvc,
        )
    retires = [] if dvc is not None else seen.retires
    points = killpoints.choose_observed(
        random.Random(seed), steps=seen.steps, commits=seen.commits, retires=retires, kills=kills
    )
    log.info("drill: %d kill points: %s", len(points), ", ".join(points))
    pace.plan(points, seen.commits, seen.steps)
    pace.reference(seen.steps)
    done: list[str] = []
    journal = vic_run / METRICS_FILE

    def victim(kill: killpoints.Kill) -> Ran:
        what = f"the victim's run to {kill.fault}"
        ran = pace.timed(journal, lambda: once(vic_root, vic_run, what, kill.fault))
        done.append(kill.fault)
        return ran

    def failed(point: str, ran: Ran) -> Exception:
        after = f"after the kill at {done[-2]}" if len(done) > 1 else "before any kill"
        return failure(f"the victim's run of {shown} ({after}, aimed at {point})", ran, vic_root)

    kill_log = victims(points, victim, failed, pace.victim)
    ran = pace.timed(journal, lambda: once(vic_root, vic_run, "the victim's last run", None))
    if ran.code != 0:
        n = len(kill_log)
        after = f"after {n} kill{'s' if n != 1 else ''}" if n else "with no kill"
        raise failure(f"the victim's last run of {shown} ({after})", ran, vic_root)
    pace.last()
    store = trust()
    diffs = compare_steps(ref_run, vic_run, plan.level)
    last = step_dir_name(seen.steps)
    diffs += compare_final(
        ref_run / last, vic_run / last, store, plan.level, allow_untrusted=allow_untrusted
    )
    diffs += never_reached(kill_log)
    return conclude(
        plan.out,
        ref_run,
        vic_run,
        level=plan.level.level,
        kills=kill_log,
        differences=diffs,
        steps=seen.steps,
        started=started,
    )
