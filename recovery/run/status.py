"""What the parts of one checkpointer share about its run as the run goes on.

The checkpointer is composed of parts (restoring, saving, the tiers, the batch job);
none owns the run's identity or its progress, so they share one :class:`RunStatus`,
which the checkpointer makes and hands to each. It holds values only: who decides
what is in each module that writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.integrity.keys.signing import TrustStore


@dataclass
class Identity:
    """Who a run is and where it came from."""

    run_id: str
    lineage: list[dict[str, Any]]
    step: int = 0
    previous: dict[str, Any] | None = None
    parent: dict[str, Any] | None = None
    drift: list[str] = field(default_factory=list)
    resumed_from: Path | None = None
    resharded: dict[str, Any] | None = None
    """Old and new world size, when a resume changed it."""
    old_config: dict[str, Any] | None = None
    """The resumed checkpoint's config (redacted), to tell what this run changed."""
    restored: list[str] = field(default_factory=list)
    """The components a resume restored (``rng`` last)."""
    absent: dict[str, str] = field(default_factory=dict)
    """What the resumed checkpoint declared absent, name -> reason."""


@dataclass
class RunStatus:
    """Who the run is, how far it has saved and committed, and what checkpoints cost it.

    A restore replaces :attr:`identity`; a commit links it to the artifact it wrote.
    """

    identity: Identity
    last_saved: int | None = None
    """The newest step saved, committed or still being written (or resumed from)."""
    persisted: int | None = None
    """The newest step committed in the run directory (or resumed from there); a save
    merely submitted, or a local snapshot not yet promoted, is not."""
    pause_s: float = 0.0
    """Time the training thread spent on checkpoints (sync saves, async pauses and waits)."""


@dataclass(frozen=True)
class Trust:
    """Whose artifacts a run may load, and whose seals on its journal it believes."""

    artifacts: TrustStore
    events: TrustStore
    """The trust store and this writer's own key (:mod:`recovery.integrity.keys.seal`)."""
    allow_untrusted: bool = False
