"""The drill's progress: a line per run and per kill as it happens, with the time left.

Both drills (:mod:`recovery.tools.drill`, :mod:`recovery.tools.drill.command`) report
through a :class:`Pace`: the reference run, each kill (its point in words), the last
resume and the comparison. The time left is :func:`recovery.progress.estimate_left`
over the runs still to come, each sized by the steps it will train (:func:`run_steps`),
fitted to the runs measured so far and to their start-up times (the journal's
``first_step`` record: how long a process took to train its first step).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from recovery.progress import duration_text, estimate_left
from recovery.tools import killpoints
from recovery.tools.drill.runs import Ran, exit_text

Say = Callable[..., None]
"""``say(text, advance=runs ended, left=time left)``: :meth:`recovery.progress.Lines.say`."""

_PHASES = {
    "write": "writing its tensors",
    "before-manifest": "before its signature",
    "before-rename": "signed, before its rename",
}


def describe(point: str) -> str:
    """A kill point's label (:mod:`recovery.tools.killpoints`) in words."""
    fault, _, where = point.partition("@")
    kind, _, step = fault.rpartition("-")
    if kind == "step":
        return "between checkpoints"
    if kind.startswith("commit-"):
        return f"during the save of step {step}: {_PHASES.get(kind[len('commit-') :], kind)}"
    if kind == "retire":
        return f"while retention deletes step {step}, in the save of step {where}"
    if kind == "abandon":
        return f"a branch from step {where[len('from-') :]}, moving step {step} aside"
    if kind == "best-copy":
        return f"while copying step {step} as the best"
    if kind.startswith("dvc-"):
        return f"while DVC {'pushes' if kind == 'dvc-push' else 'registers'} step {step}"
    return point


def _resumes_at(point: str, commits: Sequence[int]) -> int:
    """The step the run after a kill at ``point`` resumes from (its newest commit then)."""
    kill = killpoints.parse(point)
    if kill.resume != "latest" or point.startswith(("retire-", "best-copy-", "dvc-")):
        return kill.step  # a branch continues from its start; after a rename, C is there
    if point.startswith("commit-"):
        return max((c for c in commits if c < kill.step), default=0)
    return max((c for c in commits if c <= kill.step), default=0)


def run_steps(points: Sequence[str], commits: Sequence[int], steps: int) -> list[int]:
    """The steps each victim run trains (one per point), then those of the last resume."""
    sizes, start = [], 0
    for point in points:
        kill = killpoints.parse(point)
        if kill.resume != "latest":
            start = kill.step  # a branch starts at +resume=<step>
        sizes.append(max(0, kill.step - start))
        start = _resumes_at(point, commits)
    return [*sizes, max(0, steps - start)]


class Pace:
    """Times the drill's runs and says each as it ends, with the estimate of the time left."""

    def __init__(self, say: Say | None) -> None:
        self._say = say
        self._samples: list[tuple[float, float]] = []
        self._todo: list[int] = []
        self._kills = 0
        self._done = 0
        self._seen: dict[Path, int] = {}
        self._took = 0.0

    def plan(self, points: Sequence[str], commits: Sequence[int], steps: int) -> None:
        """The runs to come: one per kill point, then the last resume."""
        self._todo = run_steps(points, commits, steps)
        self._kills = len(points)

    def start(self, steps: int | None) -> None:
        """Say that the reference run has begun (the longest wait without a line)."""
        length = f" of {steps} steps" if steps else ""
        self._line(f"drill: reference run{length} started", advance=0)

    def timed(self, journal: Path, go: Callable[[], Ran]) -> Ran:
        """Run ``go`` (one run, writing ``journal``) and time it, and its start-up."""
        began = time.monotonic()
        ran = go()
        self._took = time.monotonic() - began
        startup = self._startup(journal)
        if startup is not None and startup <= self._took:
            self._samples.append((0, startup))
        return ran

    def reference(self, steps: int) -> None:
        """The reference run (``steps`` long) ended, and the kills are planned."""
        self._samples.append((steps, self._took))
        self._line(f"drill: reference run 1/1 done in {duration_text(self._took)}")

    def victim(self, point: str, ran: Ran) -> None:
        """A victim run aimed at ``point`` ended: killed there, or by itself before it."""
        self._done += 1
        if self._todo:
            self._samples.append((self._todo.pop(0), self._took))
        i = f"{self._done}/{self._kills}"
        took = duration_text(self._took)
        if ran.hit:
            step = killpoints.parse(point).step
            text = f"drill: kill {i} at step {step} ({describe(point)}; {point}) after {took}"
        elif ran.code == 0:
            text = f"drill: run {i} ended by itself before {point} (never reached)"
            self._todo = self._todo[-1:]  # the series stops: the last resume is left
        else:
            text = f"drill: run {i} failed by itself ({exit_text(ran.code)}) before {point}"
            self._todo = []  # the drill stops with its error
        self._line(text)

    def last(self) -> None:
        """The last resume ran to the end; the comparison follows."""
        self._todo = []
        self._line(f"drill: last resume ran to the end in {duration_text(self._took)}")
        self._line("drill: comparing every step and the final tensors", advance=0)

    def _line(self, text: str, *, advance: int = 1) -> None:
        if self._say is None:
            return
        left = estimate_left(self._samples, self._todo)
        when = duration_text(left) if left is not None and self._todo else ""
        self._say(f"{text} [est. {when} left]" if when else text, advance=advance, left=when)

    def _startup(self, journal: Path) -> float | None:
        """Seconds the run just ended took to its first step, if it reached one (a new
        ``first_step`` record in ``journal``)."""
        lines = journal.read_text(encoding="utf-8").splitlines() if journal.exists() else []
        # only these lines are parsed: a torn line elsewhere is the verdict's to report
        firsts = [line for line in lines if '"first_step"' in line]
        new = firsts[self._seen.get(journal, 0) :]
        self._seen[journal] = len(firsts)
        try:
            age = json.loads(new[-1]).get("seconds_since_process_start") if new else None
        except ValueError:
            return None
        return float(age) if isinstance(age, int | float) else None
