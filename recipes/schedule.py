"""What a resume with another ``train.steps`` does to the learning-rate schedule, said aloud.

The recipes' schedules (warmup then cosine, :func:`recipes.common.warmup_cosine`) are
functions of the step and of ``train.steps``: a resume with a larger ``train.steps``
recomputes the schedule for the new length, so the rate jumps (a cosine that had nearly
ended at step 200 of 200 is near its peak at step 202 of 400). The checkpoint restores the
step and the rate the next step uses; the step after it follows the new schedule.
:func:`change` says so in one line, with both rates, instead of a bare ``DRIFT``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from recovery.provenance.drift import config_change


def steps_change(drift: Sequence[str]) -> tuple[int, int] | None:
    """``(before, after)`` when the resume's DRIFT lines say ``train.steps`` changed."""
    changed = config_change(drift, "train.steps")
    if changed is None or not all(isinstance(v, int) for v in changed):
        return None
    return int(changed[0]), int(changed[1])


def change(drift: Sequence[str], scheduler: Any, optimizer: Any, step: int) -> str | None:
    """The line a resume at ``step`` logs when ``train.steps`` changed since its checkpoint
    (``None`` otherwise): which rate step ``step + 1`` trains at (restored, the old
    schedule's) and which the next step takes from the schedule recomputed for the new
    length (a ``LambdaLR``'s first group; other schedulers: named without rates)."""
    changed = steps_change(drift)
    if changed is None:
        return None
    before, after = changed
    what = (
        f"train.steps changed on resume ({before} -> {after}): the learning-rate schedule "
        f"is recomputed for {after} steps"
    )
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR) and isinstance(
        optimizer, torch.optim.Optimizer
    ):
        restored = float(optimizer.param_groups[0]["lr"])
        recomputed = float(scheduler.base_lrs[0]) * float(scheduler.lr_lambdas[0](step + 1))
        what += (
            f": step {step + 1} trains at {restored:.3g} (the {before}-step schedule's, "
            f"restored), step {step + 2} at {recomputed:.3g} and on along the {after}-step "
            "schedule"
        )
    return (
        what + f". With train.steps={before} the schedule stays as it was (and the run ends "
        f"at {before}); a longer run on a schedule of its own is a new run "
        "(+init_from=<checkpoint>)"
    )
