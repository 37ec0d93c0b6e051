"""The run report's sections: curves and resumes, checkpoints, lineage, cost, warnings.

:func:`render` turns what :mod:`recovery.tools.report` gathered into the page
(:mod:`recovery.tools.report.html` escapes every text; the tables are
:mod:`recovery.tools.report.tables`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recovery.tools import audit
from recovery.tools.report import charts as report_charts
from recovery.tools.report.cost import Cost, duration
from recovery.tools.report.html import Cell, chart, items, page, para, section, table
from recovery.tools.report.lineage import Graph, edge_label, picture
from recovery.tools.report.run import Checkpoint, Story, world_sizes
from recovery.tools.report.tables import (
    checkpoints_table,
    reference_summary,
    resumes_table,
    signer_text,
)
from recovery.version import __version__


def lineage_body(g: Graph) -> str:
    if not g.nodes:
        return para("No checkpoint on disk: there is no lineage to walk.", "muted")
    nodes = []
    for node in g.nodes.values():
        link = node.link
        status = link.status if link else "start"
        css = "bad" if status == audit.FAILED else "muted" if status == audit.PRUNED else "ok"
        code = (link.code or {}) if link else {}
        nodes.append(
            [
                Cell(node.title),
                node.lane,
                Cell(status, css),
                link.step if link else 0,
                (link.purpose or "-") if link else "-",
                signer_text(link.signer) if link else "-",
                (str(code.get("commit"))[:12] + (" dirty" if code.get("dirty") else ""))
                if code.get("commit")
                else ("not-git" if link and link.status == audit.OK else "-"),
                (link.dataset or "-") if link else "-",
                (link.world_size or "-") if link else "-",
                Cell(link.error or "", "bad") if link and link.error else "",
            ]
        )
    edges = [
        [
            f"{g.nodes[e.older].title} ({g.nodes[e.older].lane})",
            f"{g.nodes[e.newer].title} ({g.nodes[e.newer].lane})",
            Cell(edge_label(e), "bad" if e.failed else ""),
        ]
        for e in g.edges
    ]
    return (
        chart(
            picture(g),
            "older -> newer; red: a link that failed verification; grey dashed: "
            "deleted by retention (its recorded digest); `recovery audit PATH --format dot` "
            "writes the same graph for Graphviz",
        )
        + table(
            [
                "artifact",
                "lane",
                "status",
                "step",
                "purpose",
                "signer",
                "code",
                "dataset",
                "ranks",
                "error",
            ],
            nodes,
        )
        + table(["older", "newer", "relation"], edges)
    )


def cost_body(c: Cost) -> str:
    interval = c.interval or {}
    facts: list[list[object]] = [
        ["saves", c.saves, "checkpoint events in the journal"],
        [
            "cost of a save to the run (C)",
            duration(c.cost_s),
            "mean pause (async: the copy; sync: the whole save)",
        ],
        ["write time (persist)", duration(c.persist_s), "mean"],
        [
            "checkpoint fraction",
            f"{100 * c.fraction:.2f} %" if c.fraction is not None else "-",
            f"{duration(c.pause_s)} of {duration(c.run_s)} in processes that completed",
        ],
        [
            "interval",
            f"{interval.get('mode', '-')}: every {interval.get('every_steps')} steps"
            if interval.get("mode") == "fixed"
            else str(interval.get("mode", "-")),
            f"about {duration(c.interval_s)} at {duration(c.step_s)} a step",
        ],
        [
            "MTBF",
            duration(c.mtbf_s),
            c.mtbf_source + (" (pass --mtbf)" if c.mtbf_source == "assumed" else ""),
        ],
        [
            "Young/Daly optimum sqrt(2·C·MTBF)",
            duration(c.optimum_s),
            f"sqrt(2 x {duration(c.cost_s)} x {duration(c.mtbf_s)})",
        ],
        ["MTBF at which this interval is optimal", duration(c.break_even_mtbf_s), "T² / (2C)"],
    ]
    plan: list[list[object]] = [
        [
            duration(r["interval_s"])
            + (" (optimum)" if r["optimum"] else "")
            + (" (this run)" if r["this_run"] else ""),
            duration(r["loss_per_failure_s"]),
            duration(r["worst_loss_per_failure_s"]),
            duration(r["checkpoint_cost_per_day_s"]),
            duration(r["failure_loss_per_day_s"]),
            duration(r["total_per_day_s"]),
        ]
        for r in c.rows
    ]
    head = [
        "interval",
        "lost per failure",
        "worst",
        "checkpoint cost/day",
        "failure loss/day",
        "total/day",
    ]
    return table(["", "value", "how"], facts) + (table(head, plan) if plan else "")


def requeued(st: Story) -> str:
    """``, 2 requeues of SLURM job 41`` (restart count above 0), or nothing."""
    jobs = sorted({str(j.get("job_id")) for j in st.requeues})
    if not jobs:
        return ""
    names = {str(j.get("scheduler", "")).upper() for j in st.requeues}
    return f", {len(st.requeues)} requeues of {'/'.join(sorted(names))} job {', '.join(jobs)}"


def render(
    run_dir: Path,
    st: Story,
    rows: Sequence[Checkpoint],
    g: Graph,
    c: Cost,
    *,
    reference: tuple[str, dict[int, dict[str, Any]]] | None = None,
) -> str:
    """The whole page."""
    ref_name, ref_steps = reference if reference else ("", None)
    failed = [r for r in rows if r.failed] + [
        n for n in g.failed if n.link and not any(r.path == n.link.path for r in rows)
    ]
    steps = sorted(st.steps)
    worlds = sorted(set(world_sizes(st)) | {r.world_size for r in rows if r.world_size})
    lines = [
        f"run directory {run_dir}",
        f"run {', '.join(st.run_ids) or '-'}; steps {steps[0] if steps else '-'}-"
        f"{steps[-1] if steps else '-'}; {len(st.processes)} processes, "
        f"{len(st.resumes)} resumes{requeued(st)}; world size "
        f"{', '.join(map(str, worlds)) or '1'}",
        "verification: "
        + (
            f"{len(failed)} artifacts FAILED"
            if failed
            else f"every checkpoint on disk verified ({sum(r.verdict == 'ok' for r in rows)})"
        ),
    ]
    curves = chart(
        report_charts.curves(st, ref_steps, ref_name),
        "dashed lines: resumes, coloured by health verdict (green ok, orange warn, "
        "grey skipped); dotted: records a resume redid; x: a process that ended "
        "without a summary (killed or crashed)",
    )
    body = curves + (reference_summary(st, ref_name, ref_steps) if ref_steps is not None else "")
    procs = [
        [
            p.kind,
            p.first_step if p.first_step is not None else "-",
            p.last_step if p.last_step is not None else "-",
            p.ended,
            duration((p.summary or {}).get("run_s")),
            p.scheduled,
        ]
        for p in st.processes
    ]
    sections = [
        section("Loss and learning rate, with resumes", body + resumes_table(st), "curves"),
        section(
            "Checkpoints",
            (chart(report_charts.timeline(rows)) if rows else "") + checkpoints_table(rows),
            "checkpoints",
        ),
        section("Lineage", lineage_body(g), "lineage"),
        section("Cost of checkpointing", cost_body(c), "cost"),
        section(
            "Processes",
            table(
                ["began", "first step", "last step", "ended", "run time", "scheduler job"], procs
            ),
            "processes",
        ),
        section("Warnings", items(st.warnings), "warnings"),
    ]
    return page(f"recovery report: {run_dir.name}", [*lines, f"recovery {__version__}"], sections)
