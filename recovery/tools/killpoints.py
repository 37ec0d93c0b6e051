"""Where a drill kills its victim: the points, the order the run reaches them, how many fit.

A point's label is what ``drill.json`` reports; the :mod:`recovery.faults` point armed
is the label up to ``@`` (:func:`parse`). With every checkpoint step C a multiple of
``every`` (and the final step), the labels are:

- ``step-N``: after step N is recorded (and its checkpoint, if due, saved).
- ``commit-write-C``, ``commit-before-manifest-C``, ``commit-before-rename-C``: inside
  the commit of step C (each phase once, at a random checkpoint before the last step).
- ``best-copy-C`` (``checkpoint.keep_best=true``): C the first checkpoint, which always
  becomes the best: its copy complete, not committed. Which later checkpoint beats the
  best depends on the losses, so ``best-swap-N`` is not drawn.
- ``retire-N@C``: retention deleting step N's checkpoint (renamed to trash, not yet
  removed) inside the commit of step C, after C's rename: the (N, C) pairs are those
  :func:`recovery.run.policy.to_delete` gives over the run's commits (C = N +
  keep_last * every unless N is a ``keep_every`` milestone; C may be the final step).
- ``abandon-M@from-S``: a victim started with ``+resume=S`` (a branch) and killed before
  it moves step M's checkpoint to ``abandoned/``. It comes right after a commit-phase
  kill at step C (its anchor), which leaves C's predecessor P newest; S < M <= P are
  steps retention keeps on disk after P's commit. The next ``+resume=latest`` finishes
  the move and continues the branch from S.
- with ``--dvc``, one background point, last: ``dvc-register-L``, ``dvc-push-L`` or
  ``retire-N@L`` (with DVC, retention's deletions run on the publisher thread too), L
  the last checkpoint before the final step, drawn by the rng.

Order: points are strictly increasing in (step, rank): at one step the commit phases,
then the best copy, the retirement, the step boundary, the background point; a branch
goes right after its anchor. A kill leaves the newest committed checkpoint at or before
its point, and resuming from there passes every later point again, with three
exceptions that the choice avoids: a kill after C's rename (``best-copy-C``,
``retire-N@C``) resumes at C, so ``step-C`` (reached after C's retention) is not drawn
with them; a background thread may be anywhere when it is killed, so there is one
background point, last; and after a branch from S, retention keeps everything until a
commit after P, which every point after the anchor is. With ``checkpoint.async=true``
the commit, best copy and retention run on the writer thread, one save at most behind
training (the next save waits for it), so the same holds.

A drilled command (``recovery drill -- CMD``) is not configured but watched: its
commits and retirements are those its uninterrupted run recorded in its journal, and
only ``step-N``, the commit phases and ``retire-N@C`` are drawn (:func:`choose_observed`).

Rejected: ``commit-aside-N`` (a re-save of a step that exists): ``+resume=latest``
never re-saves an existing step and a branch moves the later ones away first, so a
drill's run never reaches it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TypedDict, Unpack

from recovery.errors import ConfigError
from recovery.run import policy

PHASES = ("write", "before-manifest", "before-rename")
_RANK = {"write": 0, "before-manifest": 1, "before-rename": 2, "best-copy": 3, "retire": 4}
_STEP, _LAST = 5, 6


@dataclass(frozen=True)
class Kill:
    """One drawn point, as the drill runs it."""

    fault: str
    """The :mod:`recovery.faults` point to arm (``RECOVERY_PAUSE_AT``)."""
    resume: str
    """The victim's ``+resume=``: ``latest``, or a step for a branch."""
    step: int
    """The training step at which the kill happens (for the plot)."""


def parse(label: str) -> Kill:
    """What to run for a label :func:`choose_points` returned."""
    fault, _, where = label.partition("@")
    if where.startswith("from-"):
        start = where[len("from-") :]
        return Kill(fault, start, int(start))
    step = int(where or fault.rsplit("-", 1)[1])
    return Kill(fault, "latest", step)


def commit_steps(steps: int, every: int) -> list[int]:
    """Every step the run commits: the multiples of ``every`` below ``steps``, and ``steps``."""
    return [*range(every, steps, every), steps]


def bases(commits: list[int], full_every: int, chained: bool = False) -> dict[int, int]:
    """With differential saves (``full_every`` > 0): each delta's base step. Every
    ``full_every``-th commit is full; a delta's base is the commit before it (``chained``:
    ``against: previous``) or that full one. A resume continues the chain it loaded, so a
    killed and resumed run keeps the uninterrupted run's chains."""
    if full_every <= 0:
        return {}
    return {
        c: commits[i - 1 if chained else i - i % full_every]
        for i, c in enumerate(commits)
        if i % full_every != 0
    }


def retention(
    commits: list[int],
    *,
    keep_last: int,
    keep_every: int,
    full_every: int = 0,
    chained: bool = False,
) -> tuple[dict[int, list[int]], dict[int, frozenset[int]]]:
    """Per commit C of an uninterrupted run: the steps retention deletes after C's rename,
    and the steps on disk once it has (``full_every``: differential saves, see :func:`bases`)."""
    present: set[int] = set()
    doomed: dict[int, list[int]] = {}
    disk: dict[int, frozenset[int]] = {}
    chains = bases(commits, full_every, chained)
    for c in commits:
        present.add(c)
        doomed[c] = policy.to_delete(
            present, newest=c, keep_last=keep_last, keep_every=keep_every, bases=chains
        )
        present -= set(doomed[c])
        disk[c] = frozenset(present)
    return doomed, disk


@dataclass(frozen=True)
class _Room:
    """What a run offers a drill."""

    limit: int
    """Steps and commit phases are drawn below this (the final step, or L with DVC)."""
    ckpts: list[int]
    """Checkpoint steps where commit phases are drawn."""
    retires: list[tuple[int, int]]
    """(N, C): retention deletes N in the commit of C (not drawn with DVC: background)."""
    anchors: dict[int, list[int]]
    """Checkpoint C where a branch may follow a commit-phase kill -> the steps on disk
    then (those retention keeps after the commit before C's; the last is that one)."""
    background: list[str]
    best: int | None
    """The step of the ``best-copy`` point, if one is drawn."""

    @property
    def capacity(self) -> int:
        """Distinct points every draw can hold: each special point once, and every step
        boundary below ``limit`` but one for each special point that may exclude its own."""
        best = self.best is not None
        retire = bool(self.retires)
        specials = bool(self.background) + len(PHASES) + retire + bool(self.anchors) + best
        excluded = any(c < self.limit for _, c in self.retires) + best
        return specials + self.limit - 1 - excluded


def _room(
    steps: int,
    every: int,
    *,
    keep_last: int = 3,
    keep_every: int = 0,
    keep_best: bool = False,
    dvc: bool = False,
    full_every: int = 0,
    chained: bool = False,
) -> _Room:
    if every <= 0 or every >= steps:
        raise ConfigError(
            f"drill: no checkpoint before step {steps} with every_steps={every}: set "
            "checkpoint.every_steps= to fewer steps than train.steps"
        )
    commits = commit_steps(steps, every)
    doomed, disk = retention(
        commits, keep_last=keep_last, keep_every=keep_every, full_every=full_every, chained=chained
    )
    ckpts, limit, background = commits[:-1], steps, []
    if dvc:
        # the publisher runs while training goes on, so after its kill the run may be
        # anywhere: one background point, at the last checkpoint, after every other point
        limit = ckpts[-1]
        background = [f"dvc-register-{limit}", f"dvc-push-{limit}"]
        background += [f"retire-{n}@{limit}" for n in doomed[limit]]
        ckpts = [c for c in ckpts if c < limit] or ckpts
    # a branch needs two steps on disk once the commit before its anchor's is done
    before = dict(zip(commits[1:], commits, strict=False))
    on_disk = {c: sorted(disk[before[c]]) for c in ckpts if c in before}
    anchors = {c: steps_there for c, steps_there in on_disk.items() if len(steps_there) > 1}
    return _Room(
        limit=limit,
        ckpts=ckpts,
        retires=[] if dvc else [(n, c) for c in commits for n in doomed[c]],
        anchors=anchors,
        background=background,
        # a best-copy kill at C resumes at C, which never registers C again: with DVC,
        # whose one point is at L, only below L
        best=commits[0] if keep_best and commits[0] < limit else None,
    )


class Schedule(TypedDict, total=False):
    """The settings besides length and interval that decide a run's kill points (the
    defaults of :func:`_room`)."""

    keep_last: int
    keep_every: int
    keep_best: bool
    dvc: bool
    full_every: int
    chained: bool


def capacity(*, steps: int, every: int, **schedule: Unpack[Schedule]) -> int:
    """The most kills :func:`choose_points` draws for this run (any seed).

    Raises:
        ConfigError: the run commits no checkpoint before its final step.
    """
    return _room(steps, every, **schedule).capacity


def choose_points(
    rng: random.Random, *, steps: int, every: int, kills: int, **schedule: Unpack[Schedule]
) -> list[str]:
    """``kills`` distinct kill points (labels, see the module) in the order the run reaches them.

    Drawn in this priority while ``kills`` lasts: the DVC background point (``dvc``), the
    three commit phases (each at a random checkpoint), one retirement, one branch (its
    anchor one of those phases, moved to a checkpoint that allows it), the best copy
    (``keep_best``), then random distinct step boundaries.

    Raises:
        ConfigError: no checkpoint before the final step, or ``kills`` outside 0 to
            :func:`capacity` (never a loop that cannot finish).
    """
    room = _room(steps, every, **schedule)
    return _draw(rng, room, kills, f"a {steps}-step run saving every {every} steps")


def observed_room(steps: int, commits: list[int], retires: list[tuple[int, int]]) -> _Room:
    """What a run that was watched, not configured, offers: its step boundaries, the commit
    phases of its checkpoints and its retirements, as its journal recorded them
    (:mod:`recovery.tools.drill.command`). No branch (that needs ``+resume=<step>``), no
    best copy and no DVC point: an arbitrary command offers neither the flag nor the
    settings that decide them.

    Raises:
        ConfigError: the run committed no checkpoint before ``steps``.
    """
    ckpts = sorted(c for c in commits if c < steps)
    if not ckpts:
        raise ConfigError(
            f"drill: the command committed no checkpoint before its last step {steps} "
            f"(commits at {sorted(commits)}): save every N steps, N below the run's length"
        )
    return _Room(
        limit=steps, ckpts=ckpts, retires=sorted(retires), anchors={}, background=[], best=None
    )


def choose_observed(
    rng: random.Random,
    *,
    steps: int,
    commits: list[int],
    retires: list[tuple[int, int]],
    kills: int,
) -> list[str]:
    """Like :func:`choose_points`, for the room :func:`observed_room` describes: the three
    commit phases, one retirement (``retire-N@C``), then step boundaries.

    Raises:
        ConfigError: no checkpoint before ``steps``, or ``kills`` outside what it holds.
    """
    room = observed_room(steps, commits, retires)
    return _draw(rng, room, kills, f"a {steps}-step run committing at steps {sorted(commits)}")


def _draw(rng: random.Random, room: _Room, kills: int, what: str) -> list[str]:
    if not 0 <= kills <= room.capacity:
        raise ConfigError(
            f"drill --kills: expected 0 to {room.capacity} (the distinct kill points of "
            f"{what}), got {kills}"
        )
    chosen: dict[tuple[int, int, int], str] = {}
    left = kills
    if room.background and left:
        chosen[(room.limit, _LAST, 0)] = rng.choice(room.background)
        left -= 1
    phases = list(PHASES[: min(left, len(PHASES))])
    left -= len(phases)
    if room.retires and left:
        n, c = rng.choice(room.retires)
        chosen[(c, _RANK["retire"], 0)] = f"retire-{n}@{c}"
        left -= 1
    if room.anchors and left:
        phase = phases.pop(rng.randrange(len(phases)))
        c = rng.choice(sorted(room.anchors))
        disk = room.anchors[c]
        start = rng.choice(disk[:-1])
        moved = rng.choice([s for s in disk if s > start])
        chosen[(c, _RANK[phase], 0)] = f"commit-{phase}-{c}"
        chosen[(c, _RANK[phase], 1)] = f"abandon-{moved}@from-{start}"
        left -= 1
    for phase in phases:
        at = rng.choice(room.ckpts)
        chosen[(at, _RANK[phase], 0)] = f"commit-{phase}-{at}"
    if room.best is not None and left:
        chosen[(room.best, _RANK["best-copy"], 0)] = f"best-copy-{room.best}"
        left -= 1
    # a kill after C's rename resumes at C, which never passes step-C again
    done = {c for c, rank, _ in chosen if rank in (_RANK["best-copy"], _RANK["retire"])}
    for s in rng.sample([s for s in range(1, room.limit) if s not in done], left):
        chosen[(s, _STEP, 0)] = f"step-{s}"
    return [chosen[key] for key in sorted(chosen)]
