"""Builds a checkpointer's parts from the config and wires them to one another.

:func:`assemble` is the one place that knows which part needs which: the shared
:class:`~recovery.run.status.RunStatus`, what follows a commit
(:class:`~recovery.run.saving.aftercommit.AfterCommit`, handed to every writer as its
``committed`` callback), where a save runs (:func:`~recovery.run.writing.strategies.choose`),
the local tier, the :class:`~recovery.run.restoring.sequence.Restorer`, the
:class:`~recovery.run.saving.boundary.Saves` and the
:class:`~recovery.run.scheduling.batchjob.BatchJob`. The
:class:`~recovery.run.checkpointer.Checkpointer` holds what it returns and delegates.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recovery.config import CheckpointConfig, HealthConfig, SigningConfig
from recovery.format.layout import METRICS_FILE
from recovery.integrity.commits.reaping import Reaper
from recovery.integrity.keys import trust as keys
from recovery.integrity.keys.signing import Signer, TrustStore
from recovery.parallel import multirank
from recovery.parallel.world import World
from recovery.provenance import capture as prov
from recovery.provenance.purpose import BUILTIN, PurposeSpec
from recovery.provenance.recordable import recordable
from recovery.run.journal import Journal
from recovery.run.restoring.sequence import Restorer
from recovery.run.saving.aftercommit import AfterCommit
from recovery.run.saving.boundary import Saves
from recovery.run.scheduling.batchjob import BatchJob
from recovery.run.scheduling.cadence import Cadence
from recovery.run.scheduling.preemption import PreemptionGuard
from recovery.run.status import Identity, RunStatus, Trust
from recovery.run.tiers import rules
from recovery.run.tiers.snapshots import LocalTier
from recovery.run.writing import job as job_mod
from recovery.run.writing import strategies
from recovery.run.writing.differential import Differential
from recovery.storage import gitignored, tracking

log = logging.getLogger(__name__)


@dataclass
class Parts:
    """One checkpointer's parts, wired to one another, and what they were built from."""

    signer: Signer
    trust: Trust
    config: dict[str, Any]
    """The resolved config, recordable (``config.yaml``, drift)."""
    provenance: dict[str, Any]
    journal: Journal
    owns_journal: bool
    """Whether it was made here (the checkpointer closes it)."""
    preemption: PreemptionGuard | None
    status: RunStatus
    cadence: Cadence
    publisher: tracking.Publisher | None
    reaper: Reaper
    local: LocalTier | None
    restorer: Restorer
    saves: Saves
    batch: BatchJob


def assemble(
    cfg: CheckpointConfig,
    run_dir: Path,
    *,
    final_step: int,
    signer: Signer | None,
    trust: TrustStore | None,
    allow_untrusted: bool,
    provenance: dict[str, Any] | None,
    config: Mapping[str, Any] | object | None,
    model_config: dict[str, Any] | None,
    purposes: Mapping[str, PurposeSpec] | None,
    journal: Journal | None,
    preemption: PreemptionGuard | bool | None,
    health: HealthConfig | bool | None,
    world: World,
    seed: int,
    strategy: str,
) -> Parts:
    """The parts of the checkpointer these arguments describe (see
    :class:`~recovery.run.checkpointer.Checkpointer` for each), defaults filled in.

    Raises:
        ConfigError: an option the job's parallelism or the local tier does not support.
        SigningKeyError: the default signer cannot be read.
    """
    multirank.check_supported(
        world,
        async_save=cfg.async_save,
        warm_start_every=cfg.warm_start_every,
        hash_type=cfg.hash,
        differential=cfg.differential.enabled,
    )
    if cfg.local.enabled:
        rules.check_supported(differential=cfg.differential.enabled)
    signer = signer if signer is not None else keys.resolve_signer(SigningConfig())
    trust = trust if trust is not None else keys.resolve_trust(SigningConfig(), signer)
    # whose seals on the journal's steering events are believed: the trust store and this
    # writer's own key (recovery.integrity.keys.seal)
    trusted = Trust(trust, trust.with_signer(signer), allow_untrusted)
    recorded = recordable(config)
    provenance = provenance if provenance is not None else prov.capture(config=recorded)
    journal, guard, settings, owned = _defaults(
        cfg, run_dir, world, journal=journal, preemption=preemption, health=health
    )
    journal.seal_with(signer, trusted.events)
    status = RunStatus(Identity(run_id=uuid.uuid4().hex, lineage=[]))
    cadence = Cadence(cfg, final_step=final_step)
    publisher = _publisher(cfg, run_dir, world)
    reaper = Reaper()
    committed = AfterCommit(
        cfg,
        run_dir,
        status=status,
        cadence=cadence,
        journal=journal,
        signer_id=signer.key_id,
        trust=trusted,
        publisher=publisher,
        reaper=reaper,
    )
    saver = strategies.choose(
        async_save=cfg.async_save,
        world=world,
        strategy=strategy,
        signer=signer,
        committed=committed,
    )
    local = (
        LocalTier(
            cfg.local,
            run_dir,
            rank=world.rank,
            signer=signer,
            committed=committed,
            event=journal.write,
            async_save=cfg.async_save,
            world=world,
            ranks=saver if isinstance(saver, strategies.Ranks) else None,
        )
        if cfg.local.enabled
        else None
    )
    differential = Differential(cfg.differential)
    contracts = dict(purposes or BUILTIN)
    restorer = Restorer(
        cfg,
        run_dir,
        status=status,
        journal=journal,
        trust=trusted,
        world=world,
        seed=seed,
        provenance=provenance,
        config=recorded,
        purposes=contracts,
        local=local,
        differential=differential,
        final_step=final_step,
        health=settings,
        guard=guard if owned[1] else None,  # one it made: installed and uninstalled by it
    )
    saves = Saves(
        cfg,
        run_dir,
        status=status,
        cadence=cadence,
        differential=differential,
        strategy=saver,
        local=local,
        guard=guard,
        journal=journal,
        signer=signer,
        committed=committed,
        purposes=contracts,
        carried=job_mod.Carried(
            provenance=provenance,
            config_yaml=yaml.safe_dump(recorded, sort_keys=False),
            model_config=model_config,
            world_size=world.size,
        ),
        watch=lambda: restorer.watch,
    )
    batch = BatchJob(
        cfg.cluster,
        cfg.preempt_signals,
        run_dir=run_dir,
        journal=journal,
        journal_path=restorer.journal_path,
        world=world,
        final_step=final_step,
    )
    return Parts(
        signer=signer,
        trust=trusted,
        config=recorded,
        provenance=provenance,
        journal=journal,
        owns_journal=owned[0],
        preemption=guard,
        status=status,
        cadence=cadence,
        publisher=publisher,
        reaper=reaper,
        local=local,
        restorer=restorer,
        saves=saves,
        batch=batch,
    )


def _publisher(cfg: CheckpointConfig, run_dir: Path, world: World) -> tracking.Publisher | None:
    """DVC's tracking of each commit (``checkpoint.dvc``): rank 0, in a DVC repository, for
    a run directory git does not ignore (else one warning, here: not one per checkpoint)."""
    repo = tracking.find_repo(run_dir) if cfg.dvc.enabled and world.leader else None
    if repo is not None and (why := gitignored.git_ignored(repo, run_dir)):
        log.warning("%s", gitignored.not_registered(run_dir, why))
        repo = None
    if repo is None:
        return None
    return tracking.Publisher(repo, push=cfg.dvc.push, remote=cfg.dvc.remote)


def _defaults(
    cfg: CheckpointConfig,
    run_dir: Path,
    world: World,
    *,
    journal: Journal | None,
    preemption: PreemptionGuard | bool | None,
    health: HealthConfig | bool | None,
) -> tuple[Journal, PreemptionGuard | None, HealthConfig | None, tuple[bool, bool]]:
    """The checkpointer's journal, preemption guard and health settings, defaults filled in.

    - ``journal=None``: ``<run_dir>/metrics.jsonl`` (rank 0; other ranks discard).
    - ``preemption=None`` or ``True``: a guard for ``cfg.preempt_signals`` (SIGTERM,
      SIGUSR1), installed by ``restore`` on the main thread, uninstalled by ``close``;
      ``False``: none; a guard: used as given (its owner installs it).
    - ``health=None`` or ``True``: :class:`~recovery.config.HealthConfig` defaults;
      ``False``: no monitor of the checkpointer's own.

    Returns:
        The journal, the guard, the health settings, and which of journal and guard it made.
    """
    made_journal = journal is None
    if journal is None:
        journal = Journal(run_dir / METRICS_FILE if world.leader else None)
    made_guard = preemption is None or preemption is True
    guard = preemption if isinstance(preemption, PreemptionGuard) else None
    if made_guard:
        guard = PreemptionGuard(cfg.preempt_signals)
    settings = health if isinstance(health, HealthConfig) else None
    if health is None or health is True:
        settings = HealthConfig()
    return journal, guard, settings, (made_journal, made_guard)
