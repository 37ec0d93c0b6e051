"""The report's charts, drawn by matplotlib and written as SVG text for the page.

matplotlib (the ``plot`` extra) is imported only here and only when a chart is drawn,
so ``import recovery`` and the reading commands never need it; :func:`require` turns
its absence into a :class:`~recovery.errors.ConfigError` naming the extra. SVG, not
PNG: the page stays one text file, the charts scale, and with ``svg.fonttype=none``
their labels are text a browser can search and a test can read. matplotlib escapes
the text it writes into SVG; math parsing is off, so a ``$`` in a run's name is
drawn, never interpreted. Each figure gets its own hash salt, so the ids of two charts
inlined in one page never collide, and no date is written, so a report is reproducible.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import pairwise
from typing import Any, TypeGuard

from recovery.errors import ConfigError
from recovery.run.scheduling import slurm
from recovery.tools.report.run import ENDED, PREEMPTED, Checkpoint, Story

MAX_POINTS = 4000
"""Most points drawn per line: a long run is thinned (every k-th step, resumes kept)."""
HEALTH_COLOURS = {"ok": "#1b7f3b", "warn": "#e65100", "skipped": "#78909c"}


def require(what: str) -> None:
    """Refuse, naming the extra, when matplotlib cannot be imported.

    Raises:
        ConfigError: matplotlib is not installed (``pip install -e '.[plot]'``).
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            f"{what} needs matplotlib, which is not installed ({err}): pip install -e '.[plot]'"
        ) from None


@contextmanager
def style(salt: str) -> Iterator[Any]:
    """pyplot with the report's settings, in force while figures are made and saved;
    ``salt`` (one per kind of chart) keeps the SVG ids of charts in one page apart."""
    import matplotlib

    matplotlib.use("Agg")  # no display, whatever the environment says
    import matplotlib.pyplot as plt

    settings: dict[str, Any] = {
        "svg.fonttype": "none",
        "svg.hashsalt": salt,
        "text.parse_math": False,
        "font.size": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }
    with matplotlib.rc_context(settings):  # type: ignore[arg-type]
        yield plt


def _svg(plt: Any, fig: Any) -> str:
    buf = io.StringIO()
    fig.tight_layout()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


def thin(steps: Sequence[int], keep: Sequence[int] = ()) -> list[int]:
    """At most about :data:`MAX_POINTS` of ``steps`` (sorted), evenly, plus ``keep``."""
    if len(steps) <= MAX_POINTS:
        return list(steps)
    stride = -(-len(steps) // MAX_POINTS)
    wanted = set(keep) | {steps[-1]}
    return [s for i, s in enumerate(steps) if i % stride == 0 or s in wanted]


def series(steps: dict[int, dict[str, Any]], key: str, keep: Sequence[int] = ()) -> Any:
    """The (steps, values) of ``key`` in per-step records, thinned (:func:`thin`)."""
    xs = thin(sorted(s for s, r in steps.items() if _real(r.get(key))), keep)
    return xs, [float(steps[s][key]) for s in xs]


def _real(value: Any) -> TypeGuard[float]:
    """A number that is no bool (what a chart can draw)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def curves(story: Story, reference: dict[int, dict[str, Any]] | None, ref_name: str) -> str:
    """Loss and learning rate over steps: each resume a line labelled with the checkpoint
    it came from and its health verdict, each killed process's redone records dotted,
    each process end without a summary a red cross; with ``reference``, its curves
    overlaid and a third panel of the step-wise loss difference (this run - reference)."""
    with style("curves") as plt:
        rows = 3 if reference else 2
        fig, axes = plt.subplots(rows, 1, figsize=(11, 2.6 * rows + 0.6), sharex=True)
        keep = [r.step for r in story.resumes]
        for ax, key, what in ((axes[0], "loss", "loss"), (axes[1], "lr", "learning rate")):
            if reference:
                xs, ys = series(reference, key)
                ax.plot(xs, ys, lw=3, alpha=0.35, color="#90a4ae", label=f"reference {ref_name}")
            for i, gone in enumerate(story.superseded):
                pts = [(int(r["step"]), float(r[key])) for r in gone if _real(r.get(key))]
                if pts:
                    label = "redone after a resume (the ended process's records)"
                    ax.plot(
                        *zip(*pts, strict=True),
                        ls=":",
                        lw=1.2,
                        color="#8d6e63",
                        label=label if i == 0 else None,
                    )
            xs, ys = series(story.steps, key, keep)
            ax.plot(xs, ys, lw=1.3, color="#1f4e9c", label="this run (records that survived)")
            ax.set_ylabel(what)
        _marks(axes[0], story)
        for resume in story.resumes:
            axes[1].axvline(
                resume.step, color=HEALTH_COLOURS.get(resume.verdict, "#9e9e9e"), lw=1, ls="--"
            )
        if reference:
            common = sorted(s for s in story.steps if s in reference)
            pairs = [(s, story.steps[s].get("loss"), reference[s].get("loss")) for s in common]
            diff = [(s, float(a) - float(b)) for s, a, b in pairs if _real(a) and _real(b)]
            if diff:
                axes[2].plot(*zip(*diff, strict=True), lw=1, color="#6a1b9a")
            axes[2].axhline(0, color="#9e9e9e", lw=0.8)
            axes[2].set_ylabel("loss - reference")
        axes[0].legend(loc="upper right", fontsize=8)
        axes[-1].set_xlabel("step")
        return _svg(plt, fig)


def _marks(ax: Any, story: Story) -> None:
    """Resume lines with their labels, and where each process ended early."""
    for i, resume in enumerate(story.resumes):
        colour = HEALTH_COLOURS.get(resume.verdict, "#9e9e9e")
        ax.axvline(resume.step, color=colour, lw=1, ls="--")
        ax.annotate(  # staggered: resumes close together keep their labels apart
            f"resumed from {resume.name}\nhealth {resume.verdict}"
            + (f"\n{slurm.describe(resume.job)}" if resume.job else ""),
            (resume.step, 1.0 - 0.16 * (i % 4)),
            xycoords=("data", "axes fraction"),
            xytext=(3, -2),
            textcoords="offset points",
            va="top",
            fontsize=7.5,
            color=colour,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": colour, "alpha": 0.85},
        )
    last: dict[int, float] = {}
    for gone in story.superseded:
        last |= {int(r["step"]): float(r["loss"]) for r in gone if _real(r.get("loss"))}
    for proc in story.processes[:-1]:
        if proc.last_step is None or proc.ended not in (ENDED, PREEMPTED):
            continue
        y = last.get(proc.last_step, story.steps.get(proc.last_step, {}).get("loss"))
        if _real(y):
            marker, colour = ("x", "#c62828") if proc.ended == ENDED else ("v", "#6a1b9a")
            ax.plot([proc.last_step], [y], marker=marker, ms=8, color=colour, ls="none")
            ax.annotate(
                proc.ended if proc.ended == PREEMPTED else "process ended (killed?)",
                (proc.last_step, y),
                xytext=(4, 6),
                textcoords="offset points",
                fontsize=7,
                color=colour,
            )


def timeline(rows: Sequence[Checkpoint]) -> str:
    """Every checkpoint the run committed, by step: where it is now (run directory, best,
    retired, abandoned branch, remote-only), verified or failed, its DVC state; below,
    each save's pause (the training thread's cost) and write time."""
    lanes: list[tuple[str, list[Checkpoint]]] = [
        ("in the run directory", [r for r in rows if r.where == "committed"]),
        ("best", [r for r in rows if r.best]),
        ("retired by retention", [r for r in rows if r.where == "retired"]),
        ("abandoned branch", [r for r in rows if r.where == "abandoned"]),
        ("remote-only (DVC)", [r for r in rows if r.where == "remote-only"]),
    ]
    for state in ("pushed", "registered", "pending"):
        lanes.append((f"DVC {state}", [r for r in rows if r.dvc == state]))
    lanes = [(name, members) for name, members in lanes if members]
    with style("timeline") as plt:
        fig, (ax, bars) = plt.subplots(
            2,
            1,
            figsize=(11, 1.2 + 0.45 * len(lanes) + 2.4),
            sharex=True,
            height_ratios=[max(1, len(lanes)), 4],
        )
        for y, (_, members) in enumerate(lanes):
            for r in members:
                colour = "#c62828" if r.failed else "#1b7f3b" if r.verdict == "ok" else "#9e9e9e"
                ax.plot(
                    [r.step],
                    [y],
                    marker="*" if r.best else "o",
                    ms=9 if r.best else 6,
                    color=colour,
                    mfc=colour if r.verdict else "none",
                )
        ax.set_yticks(range(len(lanes)), [name for name, _ in lanes])
        ax.set_ylim(len(lanes) - 0.5, -0.5)
        ax.set_title("checkpoints: filled green verified, red failed, hollow not on disk")
        saves = sorted({r.step: r.save for r in rows if r.save is not None}.items())
        steps = [s for s, _ in saves]
        width = 0.4 * min((b - a for a, b in pairwise(steps)), default=1)
        pause = [1000 * (sv.pause_s or 0.0) for _, sv in saves]
        write = [1000 * (sv.write_s or 0.0) for _, sv in saves]
        bars.bar([s - width / 2 for s in steps], pause, width, label="pause (training waited)")
        bars.bar([s + width / 2 for s in steps], write, width, label="write (commit)")
        bars.set_ylabel("ms")
        bars.set_xlabel("step")
        bars.legend(loc="upper right", fontsize=8)
        return _svg(plt, fig)


def svg_of(plt: Any, fig: Any) -> str:
    """A figure as SVG text (the figure is closed)."""
    return _svg(plt, fig)
