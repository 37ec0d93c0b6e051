"""The drill's picture: both loss curves, and each kill drawn and labelled with its phase.

Each kill is a numbered line over the curves and, in a strip below them, a marker whose
shape and colour are its phase (a step boundary, each commit phase, a retirement, a
branch's move, the best copy, the DVC publisher) with its label, each kill on a row of
its own in the order they happened, so none hides another. One figure serves ``drill.png``
(:func:`recovery.tools.drill.verdict.plot`) and ``drill.html``
(:mod:`recovery.tools.report.drill`), drawn with the report's settings
(:func:`recovery.tools.report.charts.style`; matplotlib imported only when drawing).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from recovery.tools import killpoints
from recovery.tools.report.charts import series, style

PHASES = {
    "step": ("between steps", "o", "#455a64"),
    "commit-write": ("commit: writing tensors", "s", "#c62828"),
    "commit-before-manifest": ("commit: before the signature", "D", "#ad1457"),
    "commit-before-rename": ("commit: before the rename", "^", "#6a1b9a"),
    "retire": ("retention: deleting", "v", "#ef6c00"),
    "abandon": ("branch: moving aside", "P", "#00838f"),
    "best-copy": ("best copy", "*", "#f9a825"),
    "dvc-register": ("DVC: registering", "X", "#1565c0"),
    "dvc-push": ("DVC: pushing", "h", "#283593"),
}
"""Kill-point kind -> (phase label, marker, colour) in the drill's picture."""


def phase_of(label: str) -> tuple[str, str]:
    """A drill kill point's kind (a key of :data:`PHASES`) and its phase in words."""
    fault = label.split("@", 1)[0]
    kind = fault.rsplit("-", 1)[0]
    if kind not in PHASES:
        return kind, label
    step = killpoints.parse(label).step
    words = PHASES[kind][0]
    if kind == "step":
        return kind, f"between steps (after step {step})"
    if kind == "abandon":
        return kind, f"branch from step {step}: moving step {fault.rsplit('-', 1)[1]} aside"
    if kind == "retire":
        return kind, f"retention: deleting {fault.rsplit('-', 1)[1]} in the commit of {step}"
    return kind, f"{words} ({step})"


def drill_figure(
    plt: Any,
    reference: dict[int, dict[str, Any]],
    drilled: dict[int, dict[str, Any]],
    kills: Sequence[dict[str, Any]],
    resumes: Sequence[int],
    title: str,
) -> Any:
    """The drill's picture: both loss curves, each kill a numbered line, and below them a
    strip where each kill, in the order it happened, has a row of its own: a marker of its
    phase and its label, so kills at one step or at steps close together never hide each
    other. ``plt``: pyplot (from :func:`drill_style`)."""
    at = [killpoints.parse(str(k["point"])).step for k in kills]
    strip_in = 0.6 + 0.22 * max(len(kills), 1)  # the strip grows with the kills
    last = max([*at, *reference, *drilled], default=1)
    fig, (ax, strip) = plt.subplots(
        2, 1, figsize=(11, 4.2 + strip_in), sharex=True, height_ratios=[4.2, strip_in]
    )
    xs, ys = series(reference, "loss")
    ax.plot(xs, ys, label="reference (uninterrupted)", lw=2.5, alpha=0.6)
    xs, ys = series(drilled, "loss")
    ax.plot(xs, ys, label="drilled (killed and resumed)", lw=1, ls="--")
    for i, step in enumerate(resumes):
        ax.axvline(step, color="green", alpha=0.5, lw=1, ls=":", label="resume" if i == 0 else None)
    slots: dict[int, int] = {}  # kills at one step, for the numbers over the curves
    for n, kill in enumerate(kills, 1):
        kind, words = phase_of(str(kill["point"]))
        step = killpoints.parse(str(kill["point"])).step
        slot = slots[step] = slots.get(step, -1) + 1
        row = n - 1
        _, marker, colour = PHASES.get(kind, (kind, "o", "#455a64"))
        ax.axvline(step, color=colour, alpha=0.6, lw=1)
        ax.annotate(
            f"#{n}",
            (step, 1 - 0.07 * (slot + 1)),
            xycoords=("data", "axes fraction"),
            color=colour,
            fontsize=8,
            ha="center",
        )
        hollow = "none" if not kill.get("reached") else colour
        strip.plot([step], [row], marker=marker, ms=8, color=colour, mfc=hollow, ls="none")
        missed = "" if kill.get("reached") else " (never reached)"
        right = step <= 0.6 * last  # the label on the side with room for it
        strip.annotate(
            f"#{n} {words}{missed}",
            (step, row),
            xytext=(7 if right else -7, -3),
            textcoords="offset points",
            fontsize=7.5,
            color=colour,
            ha="left" if right else "right",
        )
    strip.set_ylim(len(kills) - 0.4, -0.6)
    strip.set_yticks([])
    strip.set_ylabel("kills, in order")
    strip.set_xlabel("step")
    ax.set_title(title)
    ax.set_ylabel("training loss")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


@contextmanager
def drill_style() -> Iterator[Any]:
    """pyplot with the report's settings, for the drill's PNG and SVG."""
    with style("drill") as plt:
        yield plt
