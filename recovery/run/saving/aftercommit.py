"""What follows each commit: lineage link, best copy and retention, cost record, DVC.

Every way a save reaches the run directory (inline, the background thread, every
rank's collective save, a local snapshot's promotion) reports its commit here, on
whichever thread wrote it: :class:`AfterCommit` is the ``committed`` callback the
checkpointer hands to each of them (:data:`~recovery.run.writing.strategies.Committed`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from recovery.config import CheckpointConfig
from recovery.format.manifest import Manifest
from recovery.integrity.commits.reaping import Reaper
from recovery.provenance import lineage
from recovery.run.journal import Journal
from recovery.run.saving import retention
from recovery.run.scheduling.cadence import Cadence
from recovery.run.status import RunStatus, Trust
from recovery.run.writing.job import SaveJob
from recovery.run.writing.strategies import Cost
from recovery.storage import tracking

log = logging.getLogger(__name__)


class AfterCommit:
    """Links a committed checkpoint into the run's lineage, applies the best copy and
    retention, journals its cost and lineage, and hands it to DVC.

    A warm-start artifact (not chained) is only handed to DVC.
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        run_dir: Path,
        *,
        status: RunStatus,
        cadence: Cadence,
        journal: Journal,
        signer_id: str,
        trust: Trust,
        publisher: tracking.Publisher | None,
        reaper: Reaper,
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.status = status
        self.cadence = cadence
        self.journal = journal
        self.signer_id = signer_id
        self.trust = trust
        self.publisher = publisher
        self.reaper = reaper

    def __call__(self, job: SaveJob, mf: Manifest, cost: Cost) -> None:
        """After ``job`` committed as ``mf`` at ``cost``: link, keep best, retain, record, push."""
        if job.chained:
            self._chained(job, mf, cost)
        if self.publisher is not None:
            self.publisher.submit(job.final)
        log.info("%s %s committed (%.3fs)", job.purpose, job.final, cost.write_s)

    def _chained(self, job: SaveJob, mf: Manifest, cost: Cost) -> None:
        previous, parent = job.statement.get("previous"), job.statement.get("parent")
        identity = self.status.identity
        link = identity.previous = lineage.link(mf, job.final, self.run_dir.parent)
        retired = retention.after_commit(
            self.cfg,
            self.run_dir,
            job.final,
            mf,
            trust=self.trust.artifacts,
            allow_untrusted=self.trust.allow_untrusted,
            retire=self.publisher.retire if self.publisher is not None else None,
            reaper=self.reaper,
        )
        self.status.persisted = job.step
        self.cadence.measured(cost_s=cost.planned_s, persist_s=cost.write_s)
        if retired:  # so a later resume knows these are gone on purpose (run.history)
            self.journal.write({"event": "retired", "steps": retired})
        # the run id binds a commit to its run when the chain around it is broken,
        # and its lineage (digest, signer, what it follows), for the trackers and readers
        artifact = {
            **link,
            "signer": self.signer_id,
            "previous": previous.get("sha256") if isinstance(previous, dict) else None,
            "parent": parent.get("sha256") if isinstance(parent, dict) else None,
        }
        self.journal.write(
            {
                **cost.event(job.step, sum(r.size for r in mf.files)),
                "run_id": identity.run_id,
                "artifact": artifact,
            }
        )
