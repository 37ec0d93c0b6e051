"""A run's resume certificate: the self-check verdict of each resume, as its lineage
carries it.

Every resume's verdict (its redone steps compared bit-identical, the first difference,
or why it was not compared: :mod:`recovery.run.restoring.selfcheck`) goes into the
run's lineage segment of that resume, so every later checkpoint signs it, and an
artifact exported from one carries it on: a forged or stripped verdict fails the
signature like any other signed field. ``recovery verify`` and ``recovery audit`` read
it from there, no journal needed. Pure functions over the lineage, table-tested.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from recovery.provenance.lineage import RESUME
from recovery.run.restoring.selfcheck import EXACT, INCOMPLETE, INEXACT, SKIPPED, verdict

NO_VERDICT = "no verdict"
"""A resume whose segment carries none: written before verdicts were signed, or
its check still comparing when the checkpoint was written."""

TOLERANCE = "tolerance"
"""An exact verdict within ``checkpoint.resume_check.tolerance``, counted apart."""

_COUNTED = (
    (EXACT, "bit-identical"),
    (TOLERANCE, "within tolerance"),
    (INEXACT, "INEXACT"),
    (INCOMPLETE, "ended before a redone step"),
    (SKIPPED, "not compared"),
    (NO_VERDICT, NO_VERDICT),
)


def resumes(lineage: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each resume of ``lineage``, oldest first: the step it resumed at and the verdict
    signed for it (``check``: ``None`` when there is none)."""
    out = []
    for segment in lineage:
        if segment.get("kind") != RESUME:
            continue
        check = segment.get("check")
        out.append(
            {"at_step": segment.get("at_step"), "check": check if isinstance(check, dict) else None}
        )
    return out


def status(check: Mapping[str, Any] | None) -> str:
    """A verdict's status, :data:`NO_VERDICT` for none; an exact one within a tolerance is
    counted apart from a bit-identical one."""
    if check is None:
        return NO_VERDICT
    found = str(check.get("status"))
    if found == EXACT and check.get("tolerance"):
        return TOLERANCE
    return found


def tally(found: Sequence[Mapping[str, Any]]) -> str:
    """The resumes in one line: ``2 resumes, each bit-identical`` or ``3 resumes: 1
    bit-identical, 1 INEXACT, 1 not compared``; ``no resume`` for none."""
    if not found:
        return "no resume"
    counts: dict[str, int] = {}
    for r in found:
        key = status(r.get("check"))
        counts[key] = counts.get(key, 0) + 1
    noun = "resume" if len(found) == 1 else "resumes"
    names = dict(_COUNTED)
    if len(counts) == 1:
        (key,) = counts
        if key == NO_VERDICT:
            return f"{len(found)} {noun}, none with a signed verdict"
        return f"{len(found)} {noun}, " + ("" if len(found) == 1 else "each ") + names.get(key, key)
    order = [k for k, _ in _COUNTED if k in counts] + sorted(k for k in counts if k not in names)
    return f"{len(found)} {noun}: " + ", ".join(f"{counts[k]} {names.get(k, k)}" for k in order)


def line(resume: Mapping[str, Any]) -> str:
    """One resume: ``resume at step 40: 5 of 5 redone steps bit-identical``."""
    check = resume.get("check")
    said = verdict(check) if check is not None else NO_VERDICT
    return f"resume at step {resume.get('at_step')}: {said}"
