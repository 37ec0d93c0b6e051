"""``recovery report``: a run's loss, resumes, checkpoints, lineage and cost as one HTML file.

The page is built by :mod:`recovery.tools.report` (it verifies every checkpoint it shows);
this module only parses, writes the file and picks the exit code: 0 when every artifact
verified, else the first failure's code (as ``recovery audit``), the report written either
way. Without matplotlib (the ``plot`` extra) it exits 12 naming the extra.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from recovery.cli.codes import exit_code
from recovery.cli.common import add_trust_flags, duration, emit, trust_of
from recovery.tools import report


def default_out(run_dir: Path) -> Path:
    """``./report-<run name>.html``: the report is written here, never into the run
    directory it reads (a reading command writes nothing there)."""
    return Path(f"report-{run_dir.resolve().name or 'run'}.html")


def cmd_report(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    mtbf = args.mtbf
    built = report.build(
        run_dir,
        trust_of(args),
        allow_untrusted=args.allow_untrusted,
        reference=Path(args.reference) if args.reference else None,
        exports=[Path(p) for p in args.export or []],
        mtbf_s=mtbf,
        root=Path(args.root) if args.root else None,
    )
    out = report.write(built, Path(args.out) if args.out else default_out(run_dir))
    ok = sum(r.verdict == "ok" for r in built.checkpoints)
    data = {
        "out": str(out),
        "resumes": [
            {"step": r.step, "from": r.source, "health": r.verdict} for r in built.story.resumes
        ],
        "checkpoints": len(built.checkpoints),
        "verified": ok,
        "failed": [path for path, _ in built.failures],
    }
    emit(
        args,
        data,
        f"report {out}: {len(built.story.resumes)} resumes, {len(built.checkpoints)} "
        f"checkpoints ({ok} verified), {len(built.graph.nodes)} lineage nodes",
    )
    if not built.failures:
        return 0
    path, first = built.failures[0]
    print(
        f"error: {len(built.failures)} artifacts failed verification; the first, {path}: {first}",
        file=sys.stderr,
    )
    return exit_code(first)


def register(sub: Any) -> None:
    """Add ``report`` to the subcommands."""
    p = sub.add_parser(
        "report", help="one HTML file: loss with resumes, checkpoint timeline, lineage, cost"
    )
    p.add_argument("run_dir", help="<checkpoint.root>/<run.name>")
    p.add_argument("--out", help="the HTML file to write (default ./report-<run name>.html)")
    p.add_argument("--reference", metavar="RUN_DIR", help="a run to overlay, step by step")
    p.add_argument(
        "--export",
        action="append",
        metavar="PATH",
        help="an artifact made from this run (recovery export) to add to the lineage (repeatable)",
    )
    p.add_argument(
        "--mtbf", type=duration, help="mean time between failures for the interval arithmetic (24h)"
    )
    p.add_argument(
        "--root", help="checkpoint root to find ancestors in (default: above the run dir)"
    )
    p.set_defaults(func=cmd_report)
    add_trust_flags(p)
