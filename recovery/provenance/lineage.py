"""Links between artifacts: the records that let an audit walk back to a run's start.

Every artifact's statement carries:

- ``previous``: a link to the artifact this one's state evolved from most
  recently (the run's last save, or the checkpoint it resumed from); ``None``
  for the first save of a fresh or warm-started run;
- ``parent``: a link to the checkpoint this run segment resumed or was
  warm-started from, with its ``kind``;
- ``lineage``: the list of run segments from the original start: each a
  ``start``, ``resume``, ``warm_start`` or ``import`` (weights brought in by
  ``recovery import``, whose origin is unverified) with its run id, the step it began
  at, the link it came from and any drift found then. It only grows, so a
  segment's index (``segment`` in each artifact) stays valid, and an audit can
  jump over checkpoints that retention deleted.

A link is ``{name, sha256, step, run_id, segment, purpose, path}``, where
``sha256`` is the artifact's root digest and ``path`` is relative to the
checkpoint root when the artifact lies under it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from recovery.format.manifest import Manifest

START = "start"
RESUME = "resume"
WARM_START = "warm_start"
IMPORT = "import"
"""The first segment of an imported artifact: weights from outside, origin unverified."""
PROMOTED_FROM = "promoted_from"
"""In a statement promoted under ``torchrun`` (:mod:`recovery.run.tiers.collective`): the local
snapshot (rank 0's) it was written from (``sha256``, ``step``). Its files are not that
snapshot's, so its digest differs; a link made while the run resumed from that snapshot
records the snapshot's digest, which the audit resolves to this checkpoint."""


def link(manifest: Manifest, path: Path, root: Path | None) -> dict[str, Any]:
    """A link to the artifact at ``path`` described by ``manifest``."""
    rel: str
    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix() if root else str(path)
    except ValueError:
        rel = os.path.abspath(path)
    return {
        "name": manifest.subject,
        "sha256": manifest.root,
        "step": manifest.step,
        "run_id": manifest.recovery.get("run_id"),
        "segment": manifest.recovery.get("segment"),
        "purpose": manifest.purpose,
        "path": rel,
        # a local-tier snapshot (recovery.run.tiers.rules) is not durable: say so where it is linked
        **({"tier": tier} if (tier := manifest.recovery.get("tier")) else {}),
    }


def segment(
    kind: str, run_id: str, at_step: int, source: dict[str, Any] | None, **extra: Any
) -> dict[str, Any]:
    """One run segment's record."""
    return {"kind": kind, "run_id": run_id, "at_step": at_step, "from": source, **extra}
