"""``recovery ls``: the rows of a run's local tier (:mod:`recovery.run.tiers.rules`), beside the
run directory's own.

The local directory is the one the run's journal names in its last ``local_tier`` record
(the journal is not signed: it only says where to look; every snapshot listed is verified
as any checkpoint is). A snapshot that the machine running ``ls`` cannot see (another
node's RAM, or gone since) is not listed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recovery.format.layout import METRICS_FILE, scan
from recovery.run import journal
from recovery.run.tiers import rules
from recovery.run.tiers.rules import PERSISTENT

__all__ = ["PERSISTENT", "local_dir", "local_rows"]

Row = Callable[[Path, argparse.Namespace, Any], dict[str, Any]]


def local_dir(run_dir: Path) -> Path | None:
    """The local directory the run's journal last named (``None``: no local tier)."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return None
    named = [r.get("dir") for _, r in journal.events(path) if r.get("event") == "local_tier"]
    return Path(named[-1]) if named and isinstance(named[-1], str) else None


def local_rows(
    run_dir: Path, args: argparse.Namespace, trust: Any, row: Row
) -> list[dict[str, Any]]:
    """A row per committed snapshot of the run's local tier, each verified by ``row`` (the
    persistent rows' own), marked not durable."""
    where = local_dir(run_dir)
    if where is None:
        return []
    rows = []
    for step, path in scan(where).committed:
        found = {"step": step, **row(path, args, trust), "tier": rules.LOCAL, "dvc": "-"}
        if found.get("verified"):
            found["summary"] = "ok, local snapshot (RAM of this node, not durable)"
        rows.append(found)
    return rows
