"""``recovery report``'s page assembled from a run directory (the package's :func:`build`,
see :mod:`recovery.tools.report`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from recovery.errors import CheckpointNotFoundError, RecoveryError
from recovery.format.layout import ABANDONED_DIR, BEST_DIR, METRICS_FILE, WARM_START_DIR, scan
from recovery.integrity.keys.signing import TrustStore
from recovery.run.journal import effective_steps, read
from recovery.storage import tracking
from recovery.tools import audit
from recovery.tools.report import charts as report_charts
from recovery.tools.report import page as report_page
from recovery.tools.report.cost import cost
from recovery.tools.report.lineage import Graph, graph
from recovery.tools.report.run import (
    ABANDONED,
    COMMITTED,
    REMOTE,
    RETIRED,
    Checkpoint,
    Story,
    items,
    num,
    story,
)

log = logging.getLogger(__name__)

MISSING = "missing"
"""A commit the journal records that is neither on disk nor retired nor abandoned:
deleted or lost behind the run's back (what ``+resume=latest`` warns ROLLBACK about)."""


@dataclass
class Built:
    """A rendered report."""

    html: str
    story: Story
    checkpoints: list[Checkpoint]
    graph: Graph
    failures: list[tuple[str, RecoveryError]] = field(default_factory=list)
    """Each artifact that failed verification: its path, and the error."""


def require_run(run_dir: Path, *, what: str = "report") -> Path:
    """The run's journal.

    Raises:
        CheckpointNotFoundError: ``run_dir`` is no directory, or holds no journal.
    """
    if not run_dir.is_dir():
        raise CheckpointNotFoundError(f"{what} {run_dir}: no such run directory", path=run_dir)
    journal = run_dir / METRICS_FILE
    if not journal.is_file():
        raise CheckpointNotFoundError(
            f"{what} {run_dir}: holds no journal ({METRICS_FILE}); expected a run directory "
            "(<checkpoint.root>/<run.name>) that has trained at least one step",
            path=run_dir,
        )
    return journal


def _real(path: str | Path | None) -> str:
    return os.path.realpath(path) if path else ""


def _on_disk(run_dir: Path) -> dict[str, tuple[int, str, str | None]]:
    """Every checkpoint directory of the run: real path -> (step, where, branch)."""
    found: dict[str, tuple[int, str, str | None]] = {}
    for step, path in scan(run_dir).committed:
        found[_real(path)] = (step, COMMITTED, None)
    branches = run_dir / ABANDONED_DIR
    for branch in sorted(branches.iterdir()) if branches.is_dir() else []:
        if branch.is_dir() and not branch.is_symlink():
            for step, path in scan(branch).committed:
                found[_real(path)] = (step, ABANDONED, branch.name)
    return found


def _heads(run_dir: Path, exports: Sequence[Path]) -> list[Path]:
    """Where the walks start: the newest checkpoint, each branch's newest, best, warm starts,
    exports. Newest first, so later walks mostly meet what earlier ones verified."""
    heads = [p for _, p in reversed(scan(run_dir).committed)][:1]
    branches = run_dir / ABANDONED_DIR
    for branch in sorted(branches.iterdir()) if branches.is_dir() else []:
        if branch.is_dir() and not branch.is_symlink():
            heads += [p for _, p in scan(branch).committed][-1:]
    for extra in (BEST_DIR, WARM_START_DIR):
        heads += [p for _, p in scan(run_dir / extra).committed]
    return heads + list(exports)


def _audits(
    run_dir: Path,
    trust: TrustStore,
    allow_untrusted: bool,
    exports: Sequence[Path],
    root: Path | None,
) -> list[audit.Report]:
    reports: list[audit.Report] = []
    covered: set[str] = set()
    pending = _heads(run_dir, exports)
    disk = sorted(_on_disk(run_dir).items(), key=lambda kv: -kv[1][0])
    pending += [Path(path) for path, _ in disk]
    for head in pending:
        if _real(head) in covered:
            continue
        report = audit.audit(head, trust, allow_untrusted=allow_untrusted, root=root)
        reports.append(report)
        covered |= {_real(link.path) for link in report.links if link.status != audit.PRUNED}
    return reports


def _rows(run_dir: Path, st: Story, reports: Sequence[audit.Report]) -> list[Checkpoint]:
    """The checkpoint timeline: on disk (verified), retired, abandoned, remote-only, missing."""
    links = {_real(link.path): link for r in reports for link in r.links if link.path}
    dvc_state, tracked = tracking.status(run_dir), tracking.tracked_steps(run_dir)
    in_repo = tracking.find_repo(run_dir) is not None
    dvc_on = in_repo or bool(dvc_state) or bool(tracked)
    best = {step for step, _ in scan(run_dir / BEST_DIR).committed}
    rows: list[Checkpoint] = []
    for path, (step, where, branch) in sorted(_on_disk(run_dir).items(), key=lambda kv: kv[1]):
        link = links.get(path)
        row = Checkpoint(step, Path(path).name, where, path=path, branch=branch)
        if link is not None and link.status == audit.OK:
            row.verdict, row.signer, row.world_size = "ok", link.signer, link.world_size
        elif link is not None:
            row.verdict = f"FAILED: {link.error}"
        if where == COMMITTED and dvc_on:
            state = dvc_state.get(row.name, tracking.Status())
            row.dvc = "pushed" if state.pushed else "registered" if state.registered else "pending"
        row.best, row.save = step in best, st.saves.get(step)
        rows.append(row)
    here = {r.step for r in rows if r.where == COMMITTED}
    moved = {s for ev in st.abandoned for s in items(ev.get("steps")) if isinstance(s, int)}
    for step, save in sorted(st.saves.items()):
        if step in here or any(r.step == step and r.where == ABANDONED for r in rows):
            continue
        where = RETIRED if step in st.retired - moved else ABANDONED if step in moved else MISSING
        if where == RETIRED and step in tracked:
            where = REMOTE
        rows.append(Checkpoint(step, f"step-{step:08d}", where, save=save, best=step in best))
    for step, remote in sorted(tracked.items()):
        if not any(r.step == step for r in rows):
            rows.append(Checkpoint(step, remote.name, REMOTE, dvc="registered"))
    for row in rows:
        row.loss = _loss(st, row.step)
    return sorted(rows, key=lambda r: (r.step, r.where))


def _loss(st: Story, step: int) -> float | None:
    return num(st.steps.get(step, {}).get("loss"))


def build(
    run_dir: Path,
    trust: TrustStore,
    *,
    allow_untrusted: bool = False,
    reference: Path | None = None,
    exports: Sequence[Path] = (),
    mtbf_s: float | None = None,
    root: Path | None = None,
) -> Built:
    """The report of ``run_dir`` (see the module).

    Raises:
        ConfigError: matplotlib (the ``plot`` extra) is not installed.
        CheckpointNotFoundError: ``run_dir`` (or ``reference``) is no run directory, or
            holds no journal; an export named is not there.
    """
    report_charts.require("recovery report")
    journal = require_run(run_dir)
    ref_steps = effective_steps(require_run(reference, what="--reference")) if reference else None
    st = story(read(journal))
    reports = _audits(run_dir, trust, allow_untrusted, exports, root)
    rows = _rows(run_dir, st, reports)
    g = graph(reports)
    failures: dict[str, RecoveryError] = {}  # one artifact two walks reach: once
    for r in reports:
        for link in r.failures:
            if link.exception is not None:
                failures.setdefault(_real(link.path) or str(link.name), link.exception)
    html = report_page.render(
        run_dir,
        st,
        rows,
        g,
        cost(st, mtbf_s),
        reference=(str(reference), ref_steps) if reference and ref_steps is not None else None,
    )
    return Built(html, st, rows, g, list(failures.items()))


def write(built: Built, out: Path) -> Path:
    """Write the page to ``out`` (its directory created); return ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(built.html, encoding="utf-8")
    return out
