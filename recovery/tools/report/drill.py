"""``drill.html``: a drill's verdict on the report's page layout.

The same picture as ``drill.png`` (:func:`recovery.tools.drill.chart.drill_figure`: each
kill numbered and labelled with its phase, on a row of its own) as SVG, the kills in
a table (point, phase, step, reached, exit status), the differences, and the drilled
run's resumes with their health verdicts (:func:`recovery.tools.report.tables.resumes_table`).
Everything comes from the drill's :class:`~recovery.tools.drill.verdict.Report` and the two
runs' journals; every text is escaped (:mod:`recovery.tools.report.html`).
"""

from __future__ import annotations

from pathlib import Path

from recovery.format.layout import METRICS_FILE
from recovery.run.journal import effective_steps, read
from recovery.tools import killpoints
from recovery.tools.drill.chart import drill_figure, drill_style, phase_of
from recovery.tools.drill.verdict import Report, title
from recovery.tools.report.charts import require, svg_of
from recovery.tools.report.html import Cell, badge, chart, items, page, section, table
from recovery.tools.report.run import story
from recovery.tools.report.tables import resumes_table

PAGE_FILE = "drill.html"


def write(out: Path, report: Report) -> Path:
    """Write ``out/drill.html`` for a finished drill; return its path.

    Raises:
        ConfigError: matplotlib (the ``plot`` extra) is not installed.
    """
    require("drill.html")
    ref = Path(report.reference or out / "reference")
    victim = Path(report.victim or out / "victim")
    a = effective_steps(ref / METRICS_FILE) if (ref / METRICS_FILE).is_file() else {}
    b = effective_steps(victim / METRICS_FILE) if (victim / METRICS_FILE).is_file() else {}
    with drill_style() as plt:
        svg = svg_of(plt, drill_figure(plt, a, b, report.kills, report.resumes, title(report)))
    kills = []
    for n, kill in enumerate(report.kills, 1):
        point = str(kill.get("point"))
        kills.append(
            [
                n,
                Cell(point),
                phase_of(point)[1],
                killpoints.parse(point).step,
                Cell("yes", "ok") if kill.get("reached") else Cell("NEVER", "bad"),
                kill.get("exit"),
            ]
        )
    verdict = (
        badge("PASS: the drilled run equals the uninterrupted run", "ok")
        if report.passed
        else badge(f"FAIL: {len(report.differences)} differences", "bad")
    )
    journal = victim / METRICS_FILE
    sections = [
        section(
            "Verdict",
            f"<p>{verdict.markup}</p>"
            + chart(svg, "numbered lines: the kills; green dotted: where each resume started")
            + table(["#", "point", "phase", "step", "reached", "exit"], kills),
            "verdict",
        ),
        section("Differences", items(report.differences[:500]), "differences"),
        section(
            "Resumes of the drilled run",
            resumes_table(story(read(journal))) if journal.is_file() else "",
            "resumes",
        ),
    ]
    lines = [
        f"level {report.level}; {len(report.kills)} kills; resumed at {report.resumes}; "
        f"{report.steps} steps; {report.seconds:.0f} s",
        f"reference {ref}",
        f"drilled {victim}",
    ]
    path = out / PAGE_FILE
    path.write_text(page("recovery drill", lines, sections), encoding="utf-8")
    return path
