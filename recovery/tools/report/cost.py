"""What checkpointing cost a run, and its interval against the Young/Daly optimum.

A pure function of the journal's story (:mod:`recovery.tools.report.run`): the measured
cost C of a save to the run (the mean ``pause_s``: the whole save for synchronous saves,
the pause for async ones, as :mod:`recovery.run.scheduling.cadence` measures it), the checkpoint
fraction each completed process recorded (``run_summary``) and over all of them, the
interval the run used (``every_steps`` at the measured seconds per step, or the auto
interval's own seconds), and :func:`recovery.run.policy.plan`'s arithmetic for it and
for the optimum sqrt(2 * C * MTBF), with the MTBF given, recorded (``interval=auto``) or
assumed (24h, said so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from recovery.run import policy
from recovery.tools.report.run import COMPLETED, Story, num

ASSUMED_MTBF_S = 24 * 3600.0


@dataclass
class Cost:
    saves: int
    cost_s: float | None
    """Mean cost of a save to the run (C)."""
    persist_s: float | None
    """Mean write time (a save is durable after it)."""
    async_save: bool
    run_s: float
    """Time of the processes that completed (a killed process records none)."""
    pause_s: float
    fraction: float | None
    """Checkpoint pause over run time, over the completed processes."""
    step_s: float | None
    """Measured seconds per step (completed processes)."""
    interval: dict[str, Any] | None
    """The run's interval record (``run_summary``)."""
    interval_s: float | None
    mtbf_s: float
    mtbf_source: str
    """``given``, ``recorded`` (``checkpoint.mtbf`` of an auto interval) or ``assumed``."""
    optimum_s: float | None
    """sqrt(2 * C * MTBF)."""
    break_even_mtbf_s: float | None
    """The MTBF for which the run's interval is the optimum: T^2 / (2C)."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """:func:`recovery.run.policy.plan` for the run's interval and the optimum."""


def cost(story: Story, mtbf_s: float | None = None) -> Cost:
    """The run's checkpoint cost and interval arithmetic (see the module)."""
    saves = list(story.saves.values())
    pauses = [s.pause_s for s in saves if s.pause_s is not None]
    writes = [s.write_s for s in saves if s.write_s is not None]
    done = [p for p in story.processes if p.ended == COMPLETED and p.summary]
    run_s = sum(num(p.summary.get("run_s")) or 0.0 for p in done if p.summary)
    pause_s = sum(num(p.summary.get("checkpoint_pause_s")) or 0.0 for p in done if p.summary)
    per_step = [
        (num(p.summary.get("run_s")) or 0.0) / (p.last_step - p.first_step + 1)
        for p in done
        if p.summary
        and p.first_step is not None
        and p.last_step is not None
        and p.last_step >= p.first_step
    ]
    interval = next((p.summary.get("interval") for p in reversed(done) if p.summary), None)
    interval = interval if isinstance(interval, dict) else None
    step_s = fmean(per_step) if per_step else None
    interval_s = _interval_s(interval, step_s)
    recorded = interval.get("mtbf_s") if interval else None
    if mtbf_s is not None:
        mtbf, source = mtbf_s, "given"
    elif (num(recorded) or 0.0) > 0:
        mtbf, source = num(recorded) or 0.0, "recorded"
    else:
        mtbf, source = ASSUMED_MTBF_S, "assumed"
    c = fmean(pauses) if pauses else None
    out = Cost(
        saves=len(saves),
        cost_s=c,
        persist_s=fmean(writes) if writes else None,
        async_save=any(s.mode == "async" for s in saves),
        run_s=run_s,
        pause_s=pause_s,
        fraction=pause_s / run_s if run_s > 0 else None,
        step_s=step_s,
        interval=interval,
        interval_s=interval_s,
        mtbf_s=mtbf,
        mtbf_source=source,
        optimum_s=policy.young_daly(c, mtbf) if c else None,
        break_even_mtbf_s=interval_s**2 / (2 * c) if c and interval_s else None,
    )
    if out.optimum_s:
        wanted = sorted({out.optimum_s, *([interval_s] if interval_s else [])})
        out.rows = policy.plan(c or 0.0, mtbf, wanted, async_save=out.async_save)
        for row in out.rows:
            row["optimum"] = row["interval_s"] == out.optimum_s
            row["this_run"] = row["interval_s"] == interval_s
    return out


def _interval_s(interval: dict[str, Any] | None, step_s: float | None) -> float | None:
    """The run's interval in seconds: the auto interval's, every_seconds, or every_steps at
    the measured seconds per step."""
    if not interval:
        return None
    for key in ("seconds", "every_seconds"):
        value = interval.get(key)
        if isinstance(value, int | float) and value > 0:
            return float(value)
    steps = interval.get("every_steps")
    if isinstance(steps, int) and steps > 0 and step_s:
        return steps * step_s
    return None


def duration(value: object) -> str:
    """``45.2 ms``, ``3.1 s``, ``12.5 min``, ``3.2 h`` (``-`` for none, or no number)."""
    seconds = num(value)
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"
