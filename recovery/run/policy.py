"""When to save and which checkpoints to keep: small pure functions.

They take numbers and return numbers, so each is tested with a table and the
checkpointer only wires them to the filesystem.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def should_save(step: int, *, every_steps: int, final_step: int, last_saved: int | None) -> bool:
    """Whether to checkpoint after ``step``.

    Saves on every multiple of ``every_steps`` (0 disables periodic saves) and
    at ``final_step``; never twice for the same step (e.g. the step a run was
    resumed at).
    """
    if step <= 0 or step == last_saved:
        return False
    if step == final_step:
        return True
    return every_steps > 0 and step % every_steps == 0


def to_delete(
    steps: Iterable[int],
    *,
    newest: int,
    keep_last: int,
    keep_every: int,
    bases: Mapping[int, int] | None = None,
) -> list[int]:
    """Committed steps that retention may delete, oldest first.

    Args:
        steps: the committed steps present (any order).
        newest: the step just committed and verified; never deleted, and
            nothing is deleted unless it is among ``steps``.
        keep_last: how many of the most recent steps up to ``newest`` to keep.
        keep_every: steps that are multiples of this are milestones, kept
            forever (0 disables).
        bases: differential checkpoints (deltas): step -> the step of its base (a full
            checkpoint, or another delta: a chain). A kept delta keeps its chain down to
            the full checkpoint. And since a damaged link takes every delta above it
            down, when all of the most recent ``keep_last`` hang on one full checkpoint
            the newest checkpoint before that one is kept too (with its chain): the
            fallback ``keep_last >= 2`` promises stays independent of the newest chain.

    Steps above ``newest`` are left alone: they belong to a branch this run
    abandoned by resuming from an earlier step, and are replaced as it goes.
    """
    present = sorted(set(steps))
    if newest not in present:
        return []
    bases = bases or {}
    window = [s for s in present if s <= newest][-keep_last:] if keep_last > 0 else [newest]
    keep = set(window) | {newest}
    if keep_every > 0:
        keep |= {s for s in present if s % keep_every == 0}
    roots = {chain_of(s, bases)[-1] for s in window}
    if len(roots) == 1 and keep_last > 1:
        older = [s for s in present if s < min(roots)]
        keep |= set(older[-1:])
    keep = {link for s in keep for link in chain_of(s, bases)}
    return [s for s in present if s not in keep and s < newest]


def chain_of(step: int, bases: Mapping[int, int]) -> list[int]:
    """``step`` and the steps of the chain below it, down to a full checkpoint (a base
    that names no earlier step ends it)."""
    out = [step]
    while (below := bases.get(out[-1])) is not None and below < out[-1]:
        out.append(below)
    return out


def young_daly(cost_s: float, mtbf_s: float) -> float:
    """The first-order optimal checkpoint interval sqrt(2 * C * MTBF), in seconds."""
    return float((2.0 * cost_s * mtbf_s) ** 0.5)


def auto_interval(cost_s: float, mtbf_s: float, persist_s: float) -> float:
    """Young/Daly interval, never shorter than the time a save takes to persist."""
    return max(young_daly(cost_s, mtbf_s), persist_s)


def max_loss_intervals(async_save: bool) -> int:
    """The most checkpoint intervals of work one failure can lose.

    Synchronous: one (the last save committed before training went on). Async:
    two, because the next save waits for the one in flight: a failure just before
    save N+1 is due, while save N is still being written, leaves save N-1 as the
    newest committed (the background write takes at most one interval, or the
    next save waits for it).
    """
    return 2 if async_save else 1


def plan(
    cost_s: float, mtbf_s: float, intervals: list[float], *, async_save: bool = False
) -> list[dict[str, float]]:
    """Per interval T: expected work lost per failure (T/2), the most one failure can
    lose (T, or 2T with async saves: :func:`max_loss_intervals`), checkpoint cost per day
    (C * day / T), expected failure loss per day (day / MTBF * T/2) and the total.
    """
    day = 86400.0
    rows = []
    for t in intervals:
        loss = t / 2.0
        cost_day = cost_s * day / t
        loss_day = day / mtbf_s * loss
        rows.append(
            {
                "interval_s": t,
                "loss_per_failure_s": loss,
                "worst_loss_per_failure_s": t * max_loss_intervals(async_save),
                "checkpoint_cost_per_day_s": cost_day,
                "failure_loss_per_day_s": loss_day,
                "total_per_day_s": cost_day + loss_day,
            }
        )
    return rows


def due(
    step: int,
    now: float,
    *,
    every_steps: int,
    every_seconds: float,
    final_step: int,
    last_step: int | None,
    last_time: float,
) -> bool:
    """Whether to checkpoint after ``step``: on a step multiple, after ``every_seconds``
    since the last save, or at the final step; never twice for one step."""
    if should_save(step, every_steps=every_steps, final_step=final_step, last_saved=last_step):
        return True
    if step <= 0 or step == last_step:
        return False
    return every_seconds > 0 and now - last_time >= every_seconds


def is_better(value: float, best: float | None, *, mode: str) -> bool:
    """Whether ``value`` beats ``best`` (``None``: nothing yet) in direction ``mode``."""
    if best is None:
        return value == value  # a NaN never becomes the best
    return value < best if mode == "min" else value > best


def ignored_on_resume(old: dict[str, Any], new: dict[str, Any], fixed: dict[str, str]) -> list[str]:
    """The config changes a resume cannot honour, one line each.

    Args:
        old, new: flat configs (dotted key -> value): the checkpoint's and this run's.
        fixed: dotted key (or a prefix ending in ``.``) -> what restores it from the
            checkpoint instead (e.g. ``"recipe.optim.lr": "the optimizer's state"``).
    """
    lines = []
    for key in sorted(old.keys() & new.keys()):
        if old[key] == new[key]:
            continue
        why = fixed.get(key) or next(
            (v for k, v in fixed.items() if k.endswith(".") and key.startswith(k)), None
        )
        if why is not None:
            lines.append(
                f"{key}={new[key]!r} has no effect on this resume: {why} from the checkpoint "
                f"keeps {old[key]!r}; start a new run (or +init_from=) to change it"
            )
    return lines
