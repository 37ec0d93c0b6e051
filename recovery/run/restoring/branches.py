"""Branches: resuming a run from a checkpoint older than its newest.

``+resume=40`` after the run reached 60 starts a branch at step 40. The run's
later checkpoints (50, 60) belong to the future it left: they are moved to
``<run>/abandoned/<branch>/`` (still verifiable, audited from there), so a
later ``+resume=latest`` continues the branch that was running, never the
abandoned one. The move is journaled *before* it starts (``{"event":
"abandoned", ...}``), so a kill in the middle (fault point ``abandon-N``, N
the step about to move) is finished by the next writer (:func:`finish`)
and the run's history counts those steps as retired, not rolled back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recovery import faults
from recovery.format.layout import ABANDONED_DIR, scan
from recovery.integrity import nofollow
from recovery.integrity.commits import commit
from recovery.run.restoring.history import History
from recovery.storage import tracking

log = logging.getLogger(__name__)

ABANDONED_EVENT = "abandoned"


def branch_name(step: int, now: float | None = None) -> str:
    """``from-00000040-20261201T120000``: where the branch starts and when."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"from-{step:08d}-{stamp}"


def abandon(
    run_dir: Path, step: int, record: Callable[[dict[str, Any]], None]
) -> dict[str, Any] | None:
    """Move the run's committed checkpoints after ``step`` aside; return the journal event.

    ``record`` journals the event first (it must be durable before anything moves).

    Returns:
        The event, or ``None`` when nothing is later than ``step``.
    """
    later = [(s, p) for s, p in scan(run_dir).committed if s > step]
    if not later:
        return None
    dest = run_dir / ABANDONED_DIR / branch_name(step)
    event = {
        "event": ABANDONED_EVENT,
        "from_step": step,
        "steps": [s for s, _ in later],
        "to": str(dest.relative_to(run_dir)),
    }
    record(event)
    log.warning(
        "BRANCH: resumed at step %d although the run had reached step %d; its checkpoints "
        "of steps %s are moved to %s (still verifiable), and +resume=latest continues "
        "this branch",
        step,
        later[-1][0],
        ", ".join(str(s) for s, _ in later),
        dest,
    )
    _move(run_dir, later, dest)
    return event


def finish(run_dir: Path, past: History) -> list[Path]:
    """Complete an abandonment a kill interrupted: move what the journal says was abandoned
    (and not written again since) to where it says. Returns the moved directories."""
    pending: dict[Path, list[tuple[int, Path]]] = {}
    for s, p in scan(run_dir).committed:
        to = past.abandoned.get(s)
        if to is not None:
            pending.setdefault(run_dir / to, []).append((s, p))
    moved = []
    for dest, items in pending.items():
        log.warning("finishing the move of abandoned checkpoints %s to %s", items, dest)
        _move(run_dir, items, dest)
        moved += [dest / p.name for _, p in items]
    return moved


def _move(run_dir: Path, items: list[tuple[int, Path]], dest: Path) -> None:
    # through descriptors, never following a link: an abandoned/ or branch directory
    # planted as a symlink would otherwise take committed checkpoints out of the run
    nofollow.refuse_links(run_dir, dest, "the abandoned branch's directory")
    for s, path in items:
        faults.reach(f"abandon-{s}")  # the earlier ones moved, this one not yet
        nofollow.rename(run_dir, path, dest / path.name)
        tracking.untrack(path)  # its registration named the old place
        commit.fsync_dir(dest.parent)
        commit.fsync_dir(run_dir)
