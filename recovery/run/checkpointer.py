"""The checkpoint lifecycle of one run: restore, should-save, snapshot, commit, retain.

The checkpointer owns a run directory (one writer at a time) and its identity
(run id, lineage, the link to the previous artifact), and decides: when to
save (cadence, milestones, preemption), what a save is (a
:class:`~recovery.run.job.SaveJob`) and what follows a commit (link, best copy,
retention, cost record, DVC). *Where* a save runs is :mod:`recovery.run.savers`;
*how* bytes reach the disk, :mod:`recovery.integrity.commit`; *what* the state
is, :class:`~recovery.state.registry.TrainState`; how a run begins (its
restoring half), :class:`~recovery.run.restoring.Restoring`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from recovery.config import CheckpointConfig, SigningConfig, parse_duration
from recovery.errors import Preempted, PurposeError
from recovery.format.layout import step_dir_name
from recovery.format.manifest import Manifest
from recovery.integrity import trust as keys
from recovery.integrity.lock import RunLock
from recovery.integrity.signing import Signer, TrustStore
from recovery.parallel import multirank
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.provenance import capture as prov
from recovery.provenance import lineage, purpose
from recovery.provenance.purpose import BUILTIN, PurposeSpec
from recovery.run import cadence, retention, savers
from recovery.run import job as job_mod
from recovery.run import restore as begin
from recovery.run.cadence import Cadence
from recovery.run.job import SaveJob
from recovery.run.journal import Journal
from recovery.run.preemption import PreemptionGuard
from recovery.run.restoring import Restoring
from recovery.run.savers import Cost
from recovery.state import wrapping
from recovery.state.registry import MODEL, TrainState
from recovery.storage import tracking

log = logging.getLogger(__name__)

WARM_START_DIR = "warm_start"


class Checkpointer(Restoring):
    """Saves and restores one run's :class:`TrainState`, signed, with provenance and lineage.

    Args:
        cfg: checkpoint settings.
        run_dir: ``<checkpoint.root>/<run.name>``.
        final_step: the run's last step; a checkpoint is always written there.
        signer: signs every artifact; default: as the CLI resolves it
            (``$RECOVERY_SIGNING_KEY``, else the dev key: :mod:`recovery.integrity.trust`).
        trust: keys whose artifacts may be loaded; default: the trust store of
            :class:`~recovery.config.SigningConfig` and the signer's own key.
        allow_untrusted: also load artifacts by other signers (signature still checked).
        provenance: :func:`recovery.provenance.capture.capture` of this process (captured
            here if not given).
        config: the resolved config with secrets redacted (``config.yaml``, drift).
        model_config: what rebuilds the model (stored for warm starts).
        purposes: contracts by purpose name; default :data:`recovery.provenance.purpose.BUILTIN`.
        journal: the run's ``metrics.jsonl``; start, resume and checkpoint-cost events go there.
        preemption: the run's signal guard; a request turns into a checkpoint and
            :class:`~recovery.errors.Preempted` at the next step boundary.
        world: this process's rank and the job's size (``torchrun``); every rank
            runs a checkpointer, rank 0 alone commits (:mod:`recovery.parallel.multirank`).
        seed: the run's seed, from which a resume on another world size reseeds.
        strategy: the job's parallelism (``ddp``/``fsdp``), recorded in checkpoints.
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        run_dir: Path,
        *,
        final_step: int,
        signer: Signer | None = None,
        trust: TrustStore | None = None,
        allow_untrusted: bool = False,
        provenance: dict[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
        model_config: dict[str, Any] | None = None,
        purposes: Mapping[str, PurposeSpec] | None = None,
        journal: Journal | None = None,
        preemption: PreemptionGuard | None = None,
        world: World = distributed.SINGLE,
        seed: int = 0,
        strategy: str = "ddp",
    ) -> None:
        multirank.check_supported(
            world, async_save=cfg.async_save, warm_start_every=cfg.warm_start_every
        )
        self.world = world
        self.seed = seed
        self.cfg = cfg
        self.run_dir = run_dir
        self.root = run_dir.parent
        signer = signer if signer is not None else keys.resolve_signer(SigningConfig())
        self.signer = signer
        self.trust = trust if trust is not None else keys.resolve_trust(SigningConfig(), signer)
        self.allow_untrusted = allow_untrusted
        self.config = dict(config) if config is not None else {}
        self.provenance = provenance if provenance is not None else prov.capture(config=self.config)
        self.carried = job_mod.Carried(
            provenance=self.provenance,
            config_yaml=yaml.safe_dump(self.config, sort_keys=False),
            model_config=model_config,
            world_size=world.size,
        )
        self.purposes = dict(purposes or BUILTIN)
        self.journal = journal
        self.identity = begin.Identity(run_id=uuid.uuid4().hex, lineage=[])
        """The run's id, lineage and links; a restore replaces it."""
        self.last_saved: int | None = None
        self.preemption = preemption
        self.cadence = Cadence(cfg, final_step=final_step)
        self._saver = savers.choose(
            async_save=cfg.async_save,
            world=world,
            strategy=strategy,
            signer=signer,
            committed=self._committed,
        )
        repo = tracking.find_repo(run_dir) if cfg.dvc.enabled and world.leader else None
        self.publisher = (
            tracking.Publisher(repo, push=cfg.dvc.push, remote=cfg.dvc.remote) if repo else None
        )
        self._first_step = True
        self._lock: RunLock | None = None
        self._created = time.perf_counter()
        self.pause_s = 0.0
        """Time the training thread spent on checkpoints (sync saves, async pauses and waits)."""

    # -- save ------------------------------------------------------------------

    def maybe_save(
        self,
        state: TrainState,
        step: int,
        *,
        metrics: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
    ) -> Path | None:
        """Call after every optimizer step: save if due; return the checkpoint's path or ``None``.

        ``metrics`` may be a callable, evaluated only when a checkpoint is written
        (an evaluation pass costs nothing on the other steps).

        Raises:
            CommitError: a background save failed (raised at the first step after it did).
            Preempted: a preemption signal arrived; a checkpoint of ``step`` is committed.
        """
        self._saver.raise_if_failed()
        if self._first_step:
            self._first_step = False
            self._event(cadence.first_step(step, resumed=self.resumed_from is not None))
        every = self.cfg.warm_start_every
        milestone = every > 0 and step % every == 0
        preempt = self.preemption is not None and self.preemption.requested is not None
        # every rank must take the same decision: one collective (a no-op for one process)
        preempt, due = distributed.any_of(preempt, self.cadence.due(step))
        if not (preempt or milestone or due):
            return None
        values = metrics() if callable(metrics) else metrics
        if preempt:
            self._preempt(state, step, values)
        if milestone:
            self.save_warm_start(state, step, metrics=values)
        if not due:
            return None
        return self.save(state, step, metrics=values)

    def save(
        self,
        state: TrainState,
        step: int,
        *,
        metrics: dict[str, Any] | None = None,
        sync: bool = False,
    ) -> Path:
        """Snapshot ``state`` at ``step`` as a continuation checkpoint; commit; retain.

        Where it is written was chosen at construction (:mod:`recovery.run.savers`):
        with ``checkpoint.async`` (and not ``sync``) the state is copied into the
        staging buffers and the rest happens on the background thread; the path
        is returned before it is committed (:meth:`flush` waits).

        Raises:
            PurposeError: ``state`` lacks what a continuation checkpoint requires.
            CommitError: this (sync) or the previous (async) save failed.
        """
        retention.check_metric(self.cfg, metrics)  # before the step counts as saved
        final = self.run_dir / step_dir_name(step)
        self.cadence.saved(step)
        waited = self._saver.wait()
        self.pause_s += waited
        job = self._job(final, step, purpose.CONTINUATION, metrics, expect=state.expectations(step))
        self.pause_s += self._saver.save(job, state, waited=waited, sync=sync)
        self.last_saved = step
        return final

    def save_warm_start(
        self, state: TrainState, step: int, *, metrics: dict[str, Any] | None = None
    ) -> Path:
        """Write a warm-start artifact (weights + model config) under ``warm_start/``, now."""
        model = state.components.get(MODEL)
        if model is None:
            raise PurposeError("warm-start artifacts need a registered 'model'", missing=[MODEL])
        final = self.run_dir / WARM_START_DIR / step_dir_name(step)
        final.parent.mkdir(exist_ok=True)
        job = self._job(final, step, purpose.WARM_START, metrics, chained=False)
        # inline whatever the strategy: a milestone copy is rare, and must not wait its turn
        weights = {MODEL: wrapping.canonical(model.state_dict())}
        savers.Inline(self.signer, self._committed).write_tree(job, weights)
        return final

    def _job(
        self,
        final: Path,
        step: int,
        purpose_name: str,
        metrics: dict[str, Any] | None,
        *,
        expect: dict[str, Any] | None = None,
        chained: bool = True,
    ) -> SaveJob:
        return job_mod.build(
            final,
            step,
            purpose_name=purpose_name,
            requires=self.purposes[purpose_name].requires,
            identity=self.identity,
            carried=self.carried,
            metrics=metrics,
            interval=self.cadence.describe(),
            expect=expect,
            chained=chained,
        )

    def _committed(self, job: SaveJob, mf: Manifest, cost: Cost) -> None:
        """After a commit (on whichever thread wrote it): link, keep best, retain, record, push."""
        if job.chained:
            self.identity.previous = lineage.link(mf, job.final, self.root)
            retired = retention.after_commit(
                self.cfg,
                self.run_dir,
                job.final,
                mf,
                trust=self.trust,
                allow_untrusted=self.allow_untrusted,
                retire=self.publisher.retire if self.publisher is not None else None,
            )
            self.cadence.measured(cost_s=cost.pause_s, persist_s=cost.write_s)
            if retired:  # so a later resume knows these are gone on purpose (run.history)
                self._event({"event": "retired", "steps": retired})
            self._event(cost.event(job.step, sum(r.size for r in mf.files)))
        if self.publisher is not None:
            self.publisher.submit(job.final)
        log.info("%s %s committed (%.3fs)", job.purpose, job.final, cost.write_s)

    def _preempt(self, state: TrainState, step: int, metrics: dict[str, Any] | None) -> None:
        # under torchrun another rank may have been signalled first: this one follows it
        requested = self.preemption.requested if self.preemption is not None else None
        signal_name = requested or "a peer rank's preemption"
        if self.last_saved != step:
            self.save(state, step, metrics=metrics, sync=True)
        else:
            self.pause_s += self._saver.wait()
        self._event({"event": "preempted", "signal": signal_name, "step": step})
        raise Preempted(
            f"{signal_name}: checkpointed step {step} in {self.run_dir}; "
            "requeue the same command with +resume=latest",
            step=step,
            signal_name=signal_name,
            path=self.run_dir / step_dir_name(step),
        )

    def flush(self) -> None:
        """Wait until the background save in flight (if any) is committed.

        Raises:
            CommitError: it failed.
        """
        self.pause_s += self._saver.wait()

    def close(self) -> None:
        """Flush the save in flight, stop the background thread, record the run's costs.

        Raises:
            CommitError: the last background save failed.
        """
        try:
            self.pause_s += self._saver.close()
        finally:
            self._release()
            if self.publisher is not None:
                self.publisher.close(parse_duration(self.cfg.dvc.close_timeout))
            self._event(self.cadence.summary(time.perf_counter() - self._created, self.pause_s))
