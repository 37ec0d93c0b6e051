"""The checkpoint lifecycle of one run: restore, should-save, snapshot, commit, retain.

The checkpointer owns a run directory. It never decides *what* the state is
(that is :class:`~recovery.state.TrainState`), *how* bytes reach the disk
(:mod:`recovery.commit`) or *what* a difference means (:mod:`recovery.policy`,
:mod:`recovery.provenance`, :mod:`recovery.purpose`); it wires them together
and keeps the run's identity: run id, lineage and the link to the previous
artifact. One process writes a run directory at a time.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import yaml

from recovery.config import CheckpointConfig, parse_duration
from recovery.dist import multirank, sharded
from recovery.dist import world as distributed
from recovery.dist.world import World
from recovery.errors import Preempted, PurposeError, RecoveryError, RunDirInUseError
from recovery.format import codec
from recovery.format.layout import DISTRIBUTED, scan, step_dir_name
from recovery.format.manifest import FileRecord, Manifest
from recovery.integrity import commit
from recovery.integrity.signing import Signer, TrustStore
from recovery.provenance import capture as prov
from recovery.provenance import lineage, purpose
from recovery.provenance.purpose import BUILTIN, PurposeSpec
from recovery.run import restore as begin
from recovery.run import resume, retention
from recovery.run.cadence import Cadence, process_age_s
from recovery.run.journal import Journal
from recovery.run.preemption import PreemptionGuard
from recovery.run.staging import Staging
from recovery.run.writer import BackgroundWriter
from recovery.state import snapshot
from recovery.state.registry import MODEL, TrainState
from recovery.storage import tracking

log = logging.getLogger(__name__)

WARM_START_DIR = "warm_start"


class Checkpointer:
    """Saves and restores one run's :class:`TrainState`, signed, with provenance and lineage.

    Args:
        cfg: checkpoint settings.
        run_dir: ``<checkpoint.root>/<run.name>``.
        final_step: the run's last step; a checkpoint is always written there.
        signer: signs every artifact.
        trust: keys whose artifacts may be loaded.
        allow_untrusted: also load artifacts by other signers (signature still checked).
        provenance: :func:`recovery.provenance.capture` of this process (captured
            here if not given).
        config: the resolved config with secrets redacted (``config.yaml``, drift).
        model_config: what rebuilds the model (stored for warm starts).
        purposes: contracts by purpose name; default :data:`recovery.purpose.BUILTIN`.
        journal: the run's ``metrics.jsonl``; start, resume and checkpoint-cost events go there.
        preemption: the run's signal guard; a request turns into a checkpoint and
            :class:`~recovery.errors.Preempted` at the next step boundary.
        world: this process's rank and the job's size (``torchrun``); every rank
            runs a checkpointer, rank 0 alone commits (:mod:`recovery.multirank`).
        seed: the run's seed, from which a resume on another world size reseeds.
        strategy: the job's parallelism (``ddp``/``fsdp``), recorded in checkpoints.
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        run_dir: Path,
        *,
        final_step: int,
        signer: Signer,
        trust: TrustStore,
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
        self.strategy = strategy
        self.resharded: dict[str, Any] | None = None
        self.cfg = cfg
        self.run_dir = run_dir
        self.root = run_dir.parent
        self.final_step = final_step
        self.signer = signer
        self.trust = trust
        self.allow_untrusted = allow_untrusted
        self.config = dict(config) if config is not None else {}
        self.provenance = provenance if provenance is not None else prov.capture(config=self.config)
        self.model_config = model_config
        self.purposes = dict(purposes or BUILTIN)
        self.journal = journal
        self.run_id = uuid.uuid4().hex
        self.last_saved: int | None = None
        self.previous: dict[str, Any] | None = None
        self.parent: dict[str, Any] | None = None
        self.lineage: list[dict[str, Any]] = []
        self.resumed_from: Path | None = None
        self.drift: list[str] = []
        self.preemption = preemption
        self.cadence = Cadence(cfg, final_step=final_step)
        self._writer = BackgroundWriter() if cfg.async_save else None
        repo = tracking.find_repo(run_dir) if cfg.dvc.enabled and world.leader else None
        self.publisher = (
            tracking.Publisher(repo, push=cfg.dvc.push, remote=cfg.dvc.remote) if repo else None
        )
        self._staging = Staging()
        self._first_step = True
        self._created = time.perf_counter()
        self.pause_s = 0.0
        """Time the training thread spent on checkpoints (sync saves, async pauses and waits)."""

    # -- restore ---------------------------------------------------------------

    def restore(
        self,
        state: TrainState,
        resume_spec: object | None = None,
        *,
        init_from: object | None = None,
    ) -> int:
        """Restore ``state`` as asked; return the step to start from.

        - ``resume_spec`` (``+resume=``): continue this run from that checkpoint.
          With ``latest`` and nothing to resume, fall through to ``init_from`` or
          a fresh start, so a requeued command line works at every stage.
        - ``init_from`` (``+init_from=``): a new run whose model weights come from
          a continuation or warm-start artifact; optimizer, schedule, sampler and
          step start fresh.
        - neither: a fresh run; the run directory must not hold checkpoints.

        Raises:
            RunDirInUseError: a fresh or warm-started run into a directory holding checkpoints.
            CheckpointNotFoundError, VerificationError, FormatError: a named artifact
                is absent, damaged or untrusted.
            PurposeError: the artifact cannot serve the use.
            DriftError: ``checkpoint.strict_resume`` and something changed.
            IncompatibleStateError: it does not fit ``state``; nothing was changed.
        """
        if self.world.leader:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            commit.remove_stale(self.run_dir)
        distributed.barrier()
        if resume_spec is not None:
            loaded = resume.select(
                self.run_dir, resume_spec, self.trust, allow_untrusted=self.allow_untrusted
            )
            mine = loaded.decoded.step if loaded is not None else -1
            if not distributed.all_ok(mine == distributed.broadcast_int(mine)):
                raise RecoveryError(
                    f"{self.run_dir}: the ranks chose different checkpoints to resume from "
                    f"(this rank: {loaded.path if loaded else 'none'}); is the checkpoint root "
                    "one shared filesystem for every node?",
                    path=self.run_dir,
                )
            if loaded is not None:
                return self._resume(state, loaded)
        elif committed := scan(self.run_dir).committed:
            newest = committed[-1][0]
            raise RunDirInUseError(
                f"{self.run_dir}: already holds checkpoints up to step {newest}. "
                "Pass +resume=latest to continue that run, or choose another run.name= "
                "(or checkpoint.root=) for a new one.",
                path=self.run_dir,
            )
        if init_from is not None:
            ident = begin.warm_start_from(
                state,
                Path(str(init_from)),
                run_id=self.run_id,
                trust=self.trust,
                allow_untrusted=self.allow_untrusted,
                root=self.root,
            )
            self._adopt(ident)
            self._event({"event": "warm_start", "run_id": self.run_id, "from": str(init_from)})
            return 0
        self._adopt(begin.fresh(self.run_id))
        self._event({"event": "start", "run_id": self.run_id})
        return 0

    def _resume(self, state: TrainState, loaded: resume.Loaded) -> int:
        ident = begin.resume_from(
            state,
            loaded,
            run_id=self.run_id,
            provenance=self.provenance,
            config=self.config,
            strict=self.cfg.strict_resume,
            root=self.root,
            world=self.world,
            seed=self.seed,
        )
        self._adopt(ident)
        self.resharded = ident.resharded
        self.last_saved = ident.step
        self._event(
            {
                "event": "resume",
                "from": str(loaded.path),
                "step": ident.step,
                "skipped": [str(p) for p, _ in loaded.skipped],
                "drift": ident.drift,
                "world_size": self.world.size,
                **({"resharded": ident.resharded} if ident.resharded else {}),
            }
        )
        return ident.step

    def _adopt(self, ident: begin.Identity) -> None:
        self.run_id = ident.run_id
        self.lineage = ident.lineage
        self.previous = ident.previous
        self.parent = ident.parent
        self.drift = ident.drift
        self.resumed_from = ident.resumed_from

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
        if self._writer is not None:
            self._writer.raise_if_failed()
        if self._first_step:
            self._first_step = False
            self._event(
                {
                    "event": "first_step",
                    "step": step,
                    "resumed": self.resumed_from is not None,
                    "seconds_since_process_start": process_age_s(),
                }
            )
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

        With ``checkpoint.async`` (and not ``sync``) the state is copied into the
        staging buffers and the rest happens on the background thread; the path
        is returned before it is committed (:meth:`flush` waits).

        Raises:
            PurposeError: ``state`` lacks what a continuation checkpoint requires.
            CommitError: this (sync) or the previous (async) save failed.
        """
        final = self.run_dir / step_dir_name(step)
        self.cadence.saved(step)
        waited = self._writer.wait() if self._writer is not None else 0.0
        started = time.perf_counter()
        expect = state.expectations(step)
        if self.world.distributed:
            self._save_ranks(state, final, step, metrics, expect, started)
        elif self._writer is None or sync:
            tree = state.state_dict()
            parts = {name: codec.split(part) for name, part in tree.items()}
            skeletons = {name: sk for name, (sk, _) in parts.items()}
            tensors = {name: ts for name, (_, ts) in parts.items()}
            job = self._job(
                final,
                skeletons,
                tensors,
                step,
                purpose.CONTINUATION,
                metrics,
                waited,
                expect=expect,
            )
            job(started)
        else:
            staged = self._staging.stage(state.state_dict())
            pause = time.perf_counter() - started
            job = self._job(
                final,
                staged.skeletons,
                staged.tensors,
                step,
                purpose.CONTINUATION,
                metrics,
                waited,
                pause=pause,
                expect=expect,
            )
            self.pause_s += pause
            self._writer.submit(lambda: job(time.perf_counter()))
        self.last_saved = step
        return final

    def _save_ranks(
        self,
        state: TrainState,
        final: Path,
        step: int,
        metrics: dict[str, Any] | None,
        expect: dict[str, Any],
        started: float,
    ) -> None:
        """A distributed save (:mod:`recovery.multirank`): every rank writes, rank 0 commits."""
        tmp, groups, hashed = multirank.write_parts(state, final, self.world, step)
        committed = False
        try:
            if self.world.leader:
                names = [n for n in state.components if n not in sharded.SHARDED]
                tree = {n: state.components[n].state_dict() for n in names}
                parts = {name: codec.split(part) for name, part in tree.items()}
                job = self._job(
                    final,
                    {name: sk for name, (sk, _) in parts.items()},
                    {name: ts for name, (_, ts) in parts.items()},
                    step,
                    purpose.CONTINUATION,
                    metrics,
                    0.0,
                    expect=expect,
                    tmp=tmp,
                    adopt=multirank.adopted(tmp, hashed),
                    extra={DISTRIBUTED: multirank.describe(self.world, self.strategy, groups)},
                )
                job(started)
            committed = True
        finally:
            multirank.announce(self.world, committed, final, step)

    def save_warm_start(
        self, state: TrainState, step: int, *, metrics: dict[str, Any] | None = None
    ) -> Path:
        """Write a warm-start artifact (weights + model config) under ``warm_start/``, now."""
        model = state.components.get(MODEL)
        if model is None:
            raise PurposeError("warm-start artifacts need a registered 'model'", missing=[MODEL])
        final = self.run_dir / WARM_START_DIR / step_dir_name(step)
        final.parent.mkdir(exist_ok=True)
        skeleton, tensors = codec.split(model.state_dict())
        job = self._job(
            final, {MODEL: skeleton}, {MODEL: tensors}, step, purpose.WARM_START, metrics, 0.0
        )
        job(time.perf_counter(), record=False)
        return final

    def _job(
        self,
        final: Path,
        skeletons: dict[str, Any],
        tensors: dict[str, dict[str, torch.Tensor]],
        step: int,
        purpose_name: str,
        metrics: dict[str, Any] | None,
        waited: float,
        *,
        pause: float | None = None,
        expect: dict[str, Any] | None = None,
        tmp: Path | None = None,
        adopt: list[str | FileRecord] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Callable[..., Path]:
        """Everything after the snapshot, as a closure that may run on another thread.

        The statement is built now (the run's links as of this step); encoding,
        hashing, signing, committing, retention and the cost record happen when
        the closure runs.
        """
        spec = self.purposes[purpose_name]
        meta: dict[str, Any] = {"run_id": self.run_id, "metrics": dict(metrics or {})}
        if self.model_config is not None:
            meta[snapshot.MODEL_CONFIG] = self.model_config
        if expect is not None:
            meta["expect"] = expect
        meta.update(extra or {})
        statement: dict[str, Any] = {
            "step": step,
            "purpose": purpose_name,
            "requires": list(spec.requires),
            "run_id": self.run_id,
            "segment": len(self.lineage) - 1,
            "metrics": dict(metrics or {}),
            "previous": self.previous,
            "parent": self.parent,
            "lineage": list(self.lineage),
            # the drift this run segment resumed across travels with its provenance
            "provenance": self._provenance(),
            "world_size": self.world.size,
            "interval": self.cadence.describe(),
            "started_at": time.time(),
        }
        config_yaml = yaml.safe_dump(self.config, sort_keys=False)

        def run(started: float, *, record: bool = True) -> Path:
            files = snapshot.encode_split(
                skeletons, tensors, step=step, meta=meta, config_yaml=config_yaml
            )
            have = snapshot.present(skeletons, meta, files, statement)
            purpose.check_contract(purpose_name, spec.requires, have, where=str(final))
            mf = commit.commit(
                final,
                files,
                {**statement, "components": have},
                signer=self.signer,
                tmp=tmp,
                adopt=adopt or (),
            )
            write_s = time.perf_counter() - started
            if record:
                self.previous = lineage.link(mf, final, self.root)
                if self.cfg.keep_best:
                    retention.keep_best(
                        self.run_dir,
                        final,
                        mf,
                        metric=self.cfg.best_metric,
                        mode=self.cfg.best_mode,
                        trust=self.trust,
                        allow_untrusted=self.allow_untrusted,
                    )
                retention.retain(
                    self.run_dir,
                    step,
                    keep_last=self.cfg.keep_last,
                    keep_every=self.cfg.keep_every,
                    retire=self.publisher.retire if self.publisher is not None else None,
                )
                self._record(step, pause if pause is not None else write_s, waited, write_s, mf)
            if self.publisher is not None:
                self.publisher.submit(final)
            log.info("%s %s committed (%.3fs)", purpose_name, final, write_s)
            return final

        return run

    def _provenance(self) -> dict[str, Any]:
        """This process's provenance, with what this run segment resumed across."""
        extra: dict[str, Any] = {}
        if self.drift:
            extra["drift"] = self.drift
        if self.resharded:
            extra["resharded"] = self.resharded
        return {**self.provenance, **extra}

    def _record(self, step: int, pause: float, waited: float, write_s: float, mf: Manifest) -> None:
        nbytes = sum(r.size for r in mf.files)
        if self._writer is None:
            self.pause_s += pause
        self.cadence.measured(cost_s=pause, persist_s=write_s)
        self._event(
            {
                "event": "checkpoint",
                "step": step,
                "mode": "async" if self._writer is not None else "sync",
                "pause_s": pause,
                "wait_s": waited,
                "write_s": write_s,
                "bytes": nbytes,
                "throughput_mb_s": nbytes / write_s / 1e6 if write_s > 0 else None,
            }
        )

    def _preempt(self, state: TrainState, step: int, metrics: dict[str, Any] | None) -> None:
        # under torchrun another rank may have been signalled first: this one follows it
        requested = self.preemption.requested if self.preemption is not None else None
        signal_name = requested or "a peer rank's preemption"
        if self.last_saved != step:
            self.save(state, step, metrics=metrics, sync=True)
        elif self._writer is not None:
            self._writer.wait()
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
        if self._writer is not None:
            self.pause_s += self._writer.wait()

    def _event(self, record: dict[str, Any]) -> None:
        if self.journal is not None:
            self.journal.write(record)

    def close(self) -> None:
        """Flush the save in flight, stop the background thread, record the run's costs.

        Raises:
            CommitError: the last background save failed.
        """
        try:
            if self._writer is not None:
                self._writer.close()
                self.pause_s += self._writer.waited_s
        finally:
            if self.publisher is not None:
                self.publisher.close(parse_duration(self.cfg.dvc.close_timeout))
            run_s = time.perf_counter() - self._created
            self._event(
                {
                    "event": "run_summary",
                    "run_s": run_s,
                    "checkpoint_pause_s": self.pause_s,
                    "checkpoint_fraction": self.pause_s / run_s if run_s > 0 else None,
                    "interval": self.cadence.describe(),
                }
            )
