"""The checkpoint lifecycle of one run: restore, should-save, snapshot, commit, retain.

The checkpointer owns a run directory (one writer at a time) and its identity
(run id, lineage, the link to the previous artifact), and decides: when to
save (cadence, milestones, preemption), what a save is (a
:class:`~recovery.run.job.SaveJob`) and what follows a commit (link, best copy,
retention, cost record, DVC). *Where* a save runs is :mod:`recovery.run.savers`;
*how* bytes reach the disk, :mod:`recovery.integrity.commit`; *what* the state
is, :class:`~recovery.state.registry.TrainState`; how a run begins (its
restoring half), :class:`~recovery.run.restoring.Restoring`; what follows a commit
and how it ends, :class:`~recovery.run.ending.Ending` (with a local tier,
:class:`~recovery.run.tiered.Tiered`).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from recovery import console, faults
from recovery.config import CheckpointConfig, HealthConfig, SigningConfig
from recovery.errors import CommitError, Preempted, PurposeError
from recovery.format.layout import WARM_START_DIR, step_dir_name
from recovery.integrity import trust as keys
from recovery.integrity.lock import RunLock
from recovery.integrity.reaping import Reaper
from recovery.integrity.signing import Signer, TrustStore
from recovery.parallel import multirank
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.provenance import capture as prov
from recovery.provenance import purpose
from recovery.provenance.purpose import BUILTIN, PurposeSpec
from recovery.provenance.recordable import recordable
from recovery.run import cadence, retention, savers, tiers
from recovery.run import job as job_mod
from recovery.run import restore as begin
from recovery.run.cadence import Cadence
from recovery.run.differential import Differential, Plan
from recovery.run.job import SaveJob
from recovery.run.journal import Journal
from recovery.run.localtier import LocalTier
from recovery.run.preemption import PreemptionGuard, agreed
from recovery.run.restoring import defaults
from recovery.run.tiered import Tiered
from recovery.state import wrapping
from recovery.state.registry import MODEL, TrainState
from recovery.storage import gitignored, tracking

log = logging.getLogger(__name__)


class Checkpointer(Tiered):
    """Saves and restores one run's :class:`TrainState`, signed, with provenance and lineage.

    Args:
        cfg: checkpoint settings.
        run_dir: ``<checkpoint.root>/<run.name>`` (a ``str`` or any path-like).
        final_step: the run's last step; a checkpoint is always written there.
        signer: signs every artifact; default: as the CLI resolves it
            (``$RECOVERY_SIGNING_KEY``, else the dev key: :mod:`recovery.integrity.trust`).
        trust: keys whose artifacts may be loaded; default: the trust store of
            :class:`~recovery.config.SigningConfig` and the signer's own key.
        allow_untrusted: also load artifacts by other signers (signature still checked).
        provenance: :func:`recovery.provenance.capture.capture` of this process (captured
            here if not given).
        config: the resolved config with secrets redacted (``config.yaml``, drift): a dict
            or an ``argparse.Namespace`` (paths recorded as strings); default: the
            command line (:mod:`recovery.provenance.recordable`).
        model_config: what rebuilds the model (stored for warm starts).
        purposes: contracts by purpose name; default :data:`recovery.provenance.purpose.BUILTIN`.
        journal: the run's ``metrics.jsonl`` (default ``<run_dir>/metrics.jsonl``): start,
            resume, warning and checkpoint-cost events and the per-step records
            (:meth:`record`) go there.
        preemption: the run's signal guard; a request turns into a checkpoint and
            :class:`~recovery.errors.Preempted` at the next step boundary. Default: one
            for ``cfg.preempt_signals``, installed by :meth:`restore` (main thread
            only) and uninstalled by :meth:`close`; ``False``: no signals are caught.
        health: the resume health monitor's settings (default
            :class:`~recovery.config.HealthConfig`), used when the state registers no
            ``health`` of its own (:mod:`recovery.run.watch`); ``False``: none.
        world: this process's rank and the job's size (``torchrun``); every rank
            runs a checkpointer, rank 0 alone commits (:mod:`recovery.parallel.multirank`).
        seed: the run's seed, from which a resume on another world size reseeds.
        strategy: the job's parallelism (``ddp``/``fsdp``), recorded in checkpoints.
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        run_dir: str | os.PathLike[str],
        *,
        final_step: int,
        signer: Signer | None = None,
        trust: TrustStore | None = None,
        allow_untrusted: bool = False,
        provenance: dict[str, Any] | None = None,
        config: Mapping[str, Any] | object | None = None,
        model_config: dict[str, Any] | None = None,
        purposes: Mapping[str, PurposeSpec] | None = None,
        journal: Journal | None = None,
        preemption: PreemptionGuard | bool | None = None,
        health: HealthConfig | bool | None = None,
        world: World = distributed.SINGLE,
        seed: int = 0,
        strategy: str = "ddp",
    ) -> None:
        if world.leader:  # a script that set up no logging still hears its resume, once
            console.show()
        multirank.check_supported(
            world,
            async_save=cfg.async_save,
            warm_start_every=cfg.warm_start_every,
            hash_type=cfg.hash,
            differential=cfg.differential.enabled,
        )
        if cfg.local.enabled:
            tiers.check_supported(differential=cfg.differential.enabled)
        self.world = world
        self.seed = seed
        self.cfg = cfg
        self.run_dir = run_dir = Path(run_dir)
        self.root = run_dir.parent
        signer = signer if signer is not None else keys.resolve_signer(SigningConfig())
        self.signer = signer
        self.trust = trust if trust is not None else keys.resolve_trust(SigningConfig(), signer)
        self.allow_untrusted = allow_untrusted
        self.config = recordable(config)
        self.provenance = provenance if provenance is not None else prov.capture(config=self.config)
        self.carried = job_mod.Carried(
            provenance=self.provenance,
            config_yaml=yaml.safe_dump(self.config, sort_keys=False),
            model_config=model_config,
            world_size=world.size,
        )
        self.purposes = dict(purposes or BUILTIN)
        self.journal, self.preemption, self._health, self._owned = defaults(
            cfg, run_dir, world, journal=journal, preemption=preemption, health=health
        )
        self.events_trust = self.trust.with_signer(signer)
        """Whose seals on the journal's steering events are believed: the trust store and
        this writer's own key (:mod:`recovery.integrity.seal`)."""
        self.journal.seal_with(signer, self.events_trust)
        self._watch = None
        self.identity = begin.Identity(run_id=uuid.uuid4().hex, lineage=[])
        """The run's id, lineage and links; a restore replaces it."""
        self.last_saved: int | None = None
        self.cadence = Cadence(cfg, final_step=final_step)
        self.differential = Differential(cfg.differential)
        """Which save is a full base and which a delta (``checkpoint.differential``)."""
        self._saver = savers.choose(
            async_save=cfg.async_save,
            world=world,
            strategy=strategy,
            signer=signer,
            committed=self._committed,
        )
        self.local = (
            LocalTier(
                cfg.local,
                run_dir,
                rank=world.rank,
                signer=signer,
                committed=self._committed,
                event=self._event,
                async_save=cfg.async_save,
                world=world,
                ranks=self._saver if isinstance(self._saver, savers.Ranks) else None,
            )
            if cfg.local.enabled
            else None
        )
        """The local tier (``checkpoint.local``), or ``None``: :mod:`recovery.run.tiers`."""
        repo = tracking.find_repo(run_dir) if cfg.dvc.enabled and world.leader else None
        if repo is not None and (why := gitignored.git_ignored(repo, run_dir)):
            log.warning("%s", gitignored.not_registered(run_dir, why))  # once, not per checkpoint
            repo = None
        self.publisher = (
            tracking.Publisher(repo, push=cfg.dvc.push, remote=cfg.dvc.remote) if repo else None
        )
        self._first_step = True
        self._reaper = Reaper()
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

        On its way out it is the :mod:`recovery.faults` point ``step-<step>``, so a drill
        kills any loop that calls it between steps, as it kills the recipes.

        Raises:
            CommitError: a background save failed (raised at the first step after it did).
            Preempted: a preemption signal arrived; a checkpoint of ``step`` is committed.
        """
        if self._first_step:
            self._first_step = False
            self._event(cadence.first_step(step, resumed=self.resumed_from is not None))
        every = self.cfg.warm_start_every
        milestone = every > 0 and step % every == 0
        preempt = self.preemption is not None and self.preemption.requested is not None
        # every rank must take the same decisions (whether to save, whether a background
        # save failed somewhere): one collective a step (a no-op for one process)
        failed, running = self._saver.status()
        # a snapshot still written skips the one due: on every rank alike (peer replicas)
        busy = self.local is not None and self.local.due(step) and self.local.busy()
        broken = self.local is not None and self.local.failed()
        preempt, due, failed, running, busy, broken = distributed.any_of(
            preempt, self.cadence.due(step), failed, running, busy, broken
        )
        self._saver.settle(failed=failed, running=running)
        path = None
        if self.local is not None:
            if broken:  # a snapshot's, a promotion's or a copy's failure: on every rank
                self.local.raise_if_failed()
                raise CommitError(
                    f"step {step}: another rank's local snapshot or its copy to a peer "
                    "failed (that rank's log says why); the job stops on every rank. "
                    "Requeue it: it resumes from the newest step that verifies.",
                    path=self.local.dir,
                )
            if self.local.due(step) and not (preempt or due):
                if busy:
                    self.local.skipped += 1
                else:
                    self._snapshot(state, step)
        if preempt or milestone or due:
            values = self._metrics(metrics, step)
            if preempt:
                self._preempt(state, step, values)
            if milestone:
                self.save_warm_start(state, step, metrics=values)
            if due:
                path = self.save(state, step, metrics=values)
        faults.reach(f"step-{step}")  # after the step and its save: where a drill kills
        return path

    def _metrics(
        self, metrics: dict[str, Any] | Callable[[], dict[str, Any]] | None, step: int
    ) -> dict[str, Any] | None:
        if not callable(metrics):
            return metrics
        return self._watch.evaluate(metrics, step) if self._watch is not None else metrics()

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
        waited = self._saver.wait() + (self.local.wait() if self.local is not None else 0.0)
        self.pause_s += waited
        job = self._job(
            final,
            step,
            purpose.CONTINUATION,
            metrics,
            expect=state.expectations(step),
            absent=state.absent,
            differential=self.differential.plan(),
        )
        # promoted from its local snapshot (under torchrun, every rank's: collectively)
        if self.local is not None and not sync:
            self.pause_s += self.local.save(job, state, waited=waited)
        else:
            self.pause_s += self._saver.save(job, state, waited=waited, sync=sync)
        self.last_saved = step
        if self._watch is not None:  # what must not change before the next optimizer step
            self._watch.saved(step)
        return final

    def _snapshot(self, state: TrainState, step: int) -> None:
        """A local-tier snapshot of ``step`` (not a persistent checkpoint)."""
        assert self.local is not None
        job = self._job(
            self.run_dir / step_dir_name(step),
            step,
            purpose.CONTINUATION,
            None,
            expect=state.expectations(step),
            absent=state.absent,
        )
        self.pause_s += self.local.snapshot(job, state)
        if self._watch is not None:  # what must not change before the next optimizer step
            self._watch.saved(step)

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
        absent: dict[str, str] | None = None,
        differential: Plan | None = None,
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
            absent=absent,
            shard_bytes=self.cfg.shard_bytes,
            hash_type=self.cfg.hash,
            differential=differential,
        )

    def _preempt(self, state: TrainState, step: int, metrics: dict[str, Any] | None) -> None:
        # under torchrun the ranks may not all have their signal yet, or not the same one:
        # they agree on it (the time limit's if any rank has it), and each joins it
        requested = self.preemption.requested if self.preemption is not None else None
        name = agreed(distributed.gather_text(requested or ""), self.cfg.cluster.time_limit_signal)
        if name is not None and self.preemption is not None:
            self.preemption.join(name)
        signal_name = name or "a peer rank's preemption"
        if self.last_saved != step:
            self.save(state, step, metrics=metrics, sync=True)
        else:  # that step's save, or its promotion, committed before it is said to be
            self.pause_s += self._saver.wait() + (self.local.wait() if self.local else 0.0)
        self._event({"event": "preempted", "signal": signal_name, "step": step})
        raise Preempted(
            f"{signal_name}: checkpointed step {step} in {self.run_dir}; "
            "requeue the same command (train.py: with +resume=latest)",
            step=step,
            signal_name=signal_name,
            path=self.run_dir / step_dir_name(step),
            exit_status=self.cfg.preempt_exit_code,
        )
