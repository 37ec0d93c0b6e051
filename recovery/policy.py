"""When to save and which checkpoints to keep: small pure functions.

They take numbers and return numbers, so each is tested with a table and the
checkpointer only wires them to the filesystem.
"""

from __future__ import annotations

from collections.abc import Iterable


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


def to_delete(steps: Iterable[int], *, newest: int, keep_last: int, keep_every: int) -> list[int]:
    """Committed steps that retention may delete, oldest first.

    Args:
        steps: the committed steps present (any order).
        newest: the step just committed and verified; never deleted, and
            nothing is deleted unless it is among ``steps``.
        keep_last: how many of the most recent steps up to ``newest`` to keep.
        keep_every: steps that are multiples of this are milestones, kept
            forever (0 disables).

    Steps above ``newest`` are left alone: they belong to a branch this run
    abandoned by resuming from an earlier step, and are replaced as it goes.
    """
    present = sorted(set(steps))
    if newest not in present:
        return []
    window = [s for s in present if s <= newest][-keep_last:] if keep_last > 0 else [newest]
    keep = set(window) | {newest}
    if keep_every > 0:
        keep |= {s for s in present if s % keep_every == 0}
    return [s for s in present if s not in keep and s < newest]
