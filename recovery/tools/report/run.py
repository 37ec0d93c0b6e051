"""What a run's journal tells about it: processes, resumes and their health, saves, warnings.

:func:`story` is a pure function over the records of ``metrics.jsonl`` in file order
(table-tested), so the report shows what the run recorded, never a guess: each process
from its begin event (``start``, ``resume``, ``warm_start``) to the next; how each ended
(``run_summary``: completed; ``preempted``; neither: killed or crashed after its last
recorded step); each resume with the checkpoint it came from, what it restored and what
was declared absent, the steps it redid and the ``resume_health`` verdict on it; each
save's costs; what retention retired and what a branch abandoned; the warnings. The
journal is not signed: it is shown as what the run says, and the checkpoints themselves
are verified elsewhere (:mod:`recovery.tools.report`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from recovery.run.journal import BEGIN_EVENTS, is_step
from recovery.run.restoring import selfcheck
from recovery.run.scheduling import slurm

COMPLETED, PREEMPTED, ENDED = "completed", "preempted", "ended without a summary"
"""How a process ended: its ``run_summary``; a preemption (``checkpoint.preempt_exit_code``);
neither (a SIGKILL, a crash, or still running: the journal cannot tell which)."""


@dataclass
class Process:
    """One process's part of the journal."""

    kind: str
    """``start``, ``resume``, ``warm_start`` (``begin`` the event), or ``unknown`` for
    records before any begin event."""
    begin: dict[str, Any]
    first_step: int | None = None
    last_step: int | None = None
    ended: str = ENDED
    summary: dict[str, Any] | None = None
    preempted: dict[str, Any] | None = None
    job: dict[str, Any] | None = None
    """Its ``job`` event: the scheduler job it ran in, the job's restart count and how
    the process before stopped (:mod:`recovery.run.scheduling.slurm`); ``None``: no scheduler."""

    @property
    def scheduled(self) -> str:
        """``SLURM job 41 restart 2 after time limit (SIGUSR1)``, or ``-``."""
        return slurm.describe(self.job) if self.job else "-"


@dataclass
class Resume:
    """One resume: where it came from and how it went."""

    step: int
    source: str
    """The checkpoint's path as the journal recorded it."""
    restored: list[str] = field(default_factory=list)
    absent: dict[str, Any] = field(default_factory=dict)
    drift: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Newer checkpoints ``latest`` passed over (damaged, foreign)."""
    world_size: int | None = None
    resharded: dict[str, Any] | None = None
    replaced_run: str | None = None
    tier: str = "persistent"
    """The tier it came from (``local``: a RAM snapshot, :mod:`recovery.run.tiers.rules`)."""
    health: dict[str, Any] | None = None
    """The ``resume_health`` verdict on it (``None``: the run did not get that far)."""
    previous_end: str = ENDED
    """How the process before it ended."""
    redone: tuple[int, int] | None = None
    """Steps (first, last) the process before it had recorded past the checkpoint: the
    work the resume redid."""
    job: dict[str, Any] | None = None
    """The resuming process's ``job`` event (a requeue: its restart count and cause)."""
    check: dict[str, Any] | None = None
    """The self-check of its redone steps (the ``resume_check`` summary, or the first
    difference when the run ended before the summary; ``None``: not compared)."""

    @property
    def checked(self) -> str:
        """``5 of 5 redone steps bit-identical``, ``INEXACT at step 42 (loss); ...``."""
        return selfcheck.verdict(self.check) if self.check else "not compared"

    @property
    def name(self) -> str:
        """The checkpoint's directory name (``step-00000008``; a local snapshot's with
        `` (local tier)``)."""
        local = " (local tier)" if self.tier == "local" else ""
        return (PurePath(self.source).name or self.source) + local

    @property
    def verdict(self) -> str:
        """``ok``, ``warn``, ``skipped`` or ``not judged``."""
        return str(self.health.get("status")) if self.health else "not judged"


@dataclass
class Save:
    """One ``checkpoint`` event: a commit and what it cost."""

    step: int
    mode: str | None
    pause_s: float | None
    write_s: float | None
    wait_s: float | None
    bytes: int | None


@dataclass
class Story:
    """The journal read as the run's history."""

    processes: list[Process] = field(default_factory=list)
    resumes: list[Resume] = field(default_factory=list)
    saves: dict[int, Save] = field(default_factory=dict)
    """Step -> its last save (a step saved again on a branch: the newer save)."""
    retired: set[int] = field(default_factory=set)
    abandoned: list[dict[str, Any]] = field(default_factory=list)
    """The ``abandoned`` events: ``from_step``, ``steps``, ``to``."""
    warnings: list[str] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Step -> the last record of it (the surviving run's history)."""
    superseded: list[list[dict[str, Any]]] = field(default_factory=list)
    """Per process whose records a later resume redid: those records, in order."""

    @property
    def requeues(self) -> list[dict[str, Any]]:
        """The ``job`` events of the starts a scheduler requeued (restart count above 0)."""
        return [
            p.job
            for p in self.processes
            if p.job is not None and isinstance(p.job.get("restart"), int) and p.job["restart"]
        ]


def items(value: Any) -> list[Any]:
    """A journal field that should be a list, or nothing (the journal is not signed: a
    field of another type is ignored, never iterated)."""
    return value if isinstance(value, list) else []


def num(value: Any) -> float | None:
    """A journal field that should be a number (not a bool), or ``None``."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _begin(story: Story, rec: dict[str, Any]) -> None:
    event = str(rec["event"])
    rid = rec.get("run_id")
    if isinstance(rid, str) and rid not in story.run_ids:
        story.run_ids.append(rid)
    if event != "resume":
        story.processes.append(Process(event, rec))
        return
    before = story.processes[-1] if story.processes else None
    step = int(rec["step"]) if isinstance(rec.get("step"), int) else 0
    resume = Resume(
        step=step,
        source=str(rec.get("from")),
        restored=[str(c) for c in items(rec.get("restored"))],
        absent=absent if isinstance(absent := rec.get("absent"), dict) else {},
        drift=[str(d) for d in items(rec.get("drift"))],
        skipped=[str(s) for s in items(rec.get("skipped"))],
        world_size=rec.get("world_size") if isinstance(rec.get("world_size"), int) else None,
        resharded=rec.get("resharded") if isinstance(rec.get("resharded"), dict) else None,
        replaced_run=str(rec["replaced_run"]) if rec.get("replaced_run") else None,
        tier=str(rec.get("tier") or "persistent"),
    )
    if before is not None:
        resume.previous_end = before.ended
        if before.last_step is not None and before.last_step > step:
            resume.redone = (step + 1, before.last_step)
    story.resumes.append(resume)
    story.processes.append(Process(event, rec))


def _warning(rec: dict[str, Any]) -> str | None:
    event = rec.get("event")
    if event == "warning":
        return f"{rec.get('kind')} ({rec.get('component')}): {rec.get('message')}"
    if event == "override_ignored":
        return "override ignored: " + "; ".join(str(x) for x in items(rec.get("lines")))
    return None


def story(records: Iterable[dict[str, Any]]) -> Story:
    """The run's history in journal records, in file order (see the module)."""
    out = Story()
    per_process: list[list[dict[str, Any]]] = []
    for rec in records:
        event = rec.get("event")
        if event in BEGIN_EVENTS:
            _begin(out, rec)
            per_process.append([])
            continue
        if not out.processes:  # a journal that begins mid-run (copied, truncated)
            out.processes.append(Process("unknown", {}))
            per_process.append([])
        proc = out.processes[-1]
        if is_step(rec) and isinstance(rec.get("step"), int):
            step = int(rec["step"])
            proc.first_step = step if proc.first_step is None else proc.first_step
            proc.last_step = step
            out.steps[step] = rec
            per_process[-1].append(rec)
        elif event == "run_summary":
            proc.ended, proc.summary = COMPLETED, rec
        elif event == "preempted":
            proc.ended, proc.preempted = PREEMPTED, rec
        elif event == slurm.EVENT and proc.job is None:
            proc.job = rec
            if proc.kind == "resume" and out.resumes:
                out.resumes[-1].job = rec
        elif event == "checkpoint" and isinstance(rec.get("step"), int):
            step = int(rec["step"])
            out.saves[step] = Save(
                step,
                str(rec["mode"]) if rec.get("mode") else None,
                num(rec.get("pause_s")),
                num(rec.get("write_s")),
                num(rec.get("wait_s")),
                int(rec["bytes"]) if isinstance(rec.get("bytes"), int) else None,
            )
            out.retired.discard(step)
        elif event == "retired":
            out.retired.update(s for s in items(rec.get("steps")) if isinstance(s, int))
        elif event == "abandoned":
            out.abandoned.append(rec)
        elif event == "resume_check":
            at = rec.get("resumed_at")
            for resume in reversed(out.resumes):
                if resume.step == at and (resume.check is None or rec.get("summary")):
                    resume.check = rec
                    break
        elif event == "resume_health":
            at = rec.get("resumed_at")
            for resume in reversed(out.resumes):
                if resume.step == at and resume.health is None:
                    resume.health = rec
                    break
        else:
            text = _warning(rec)
            if text:
                out.warnings.append(text)
    for resume in out.resumes:
        for skipped in resume.skipped:
            out.warnings.append(f"resume at step {resume.step} passed over {skipped}")
        if resume.replaced_run:
            out.warnings.append(
                f"resume at step {resume.step} continued another run's checkpoint "
                f"(replaced run {resume.replaced_run})"
            )
    for records_ in per_process:  # what a later resume redid: the curve before it
        gone = [r for r in records_ if out.steps.get(int(r["step"])) is not r]
        if gone:
            out.superseded.append(gone)
    return out


def world_sizes(story_: Story) -> list[int]:
    """The world sizes the run's resumes recorded, a resharded one's former size first
    (empty: none recorded, as for a run never resumed)."""
    out: list[int] = []
    for r in story_.resumes:
        before = (r.resharded or {}).get("from")
        out += [before] if isinstance(before, int) else []
        out += [r.world_size] if r.world_size is not None else []
    return out


COMMITTED, RETIRED, ABANDONED, REMOTE = "committed", "retired", "abandoned", "remote-only"
"""Where a checkpoint is: in the run directory; deleted by retention; moved to an
abandoned branch; registered with DVC but not on disk."""


@dataclass
class Checkpoint:
    """One row of the checkpoint timeline."""

    step: int
    name: str
    where: str
    """:data:`COMMITTED`, :data:`RETIRED`, :data:`ABANDONED` or :data:`REMOTE`."""
    path: str | None = None
    verdict: str | None = None
    """``ok``, what failed verification (the ``ls`` status text), or ``None`` (not on disk)."""
    exit_code: int | None = None
    best: bool = False
    dvc: str | None = None
    """``pushed``, ``registered``, ``pending`` (a DVC repository, not yet registered), or
    ``None`` (DVC does not track the run)."""
    save: Save | None = None
    loss: float | None = None
    signer: dict[str, Any] | None = None
    world_size: int | None = None
    branch: str | None = None

    @property
    def failed(self) -> bool:
        return self.verdict is not None and self.verdict != "ok"
