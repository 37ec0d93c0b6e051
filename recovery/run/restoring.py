"""The restoring half of :class:`~recovery.run.checkpointer.Checkpointer`.

How a run begins (fresh, resumed, warm-started, or a branch from an older
step) and the run's identity, journal and lock that the saving half shares.
The steps themselves are :mod:`recovery.run.restore` (``begin``) and
:mod:`recovery.run.branches`; this class only sequences them for one run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recovery.config import CheckpointConfig
from recovery.format.layout import METRICS_FILE
from recovery.integrity.lock import RunLock
from recovery.integrity.signing import TrustStore
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.run import branches, resume
from recovery.run import restore as begin
from recovery.run.journal import Journal
from recovery.state.registry import TrainState


class Restoring:
    """Restores a run's :class:`TrainState` and keeps who the run is (mixed into the
    checkpointer, which sets these attributes)."""

    cfg: CheckpointConfig
    run_dir: Path
    root: Path
    trust: TrustStore
    allow_untrusted: bool
    world: World
    seed: int
    provenance: dict[str, Any]
    config: dict[str, Any]
    journal: Journal | None
    identity: begin.Identity
    last_saved: int | None
    _lock: RunLock | None

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
            RunDirLockedError: another process is writing the run directory.
            RunDirInUseError: a fresh or warm-started run into a directory holding checkpoints.
            CheckpointNotFoundError, VerificationError, FormatError: a named artifact
                is absent, damaged or untrusted.
            ForeignCheckpointError: ``latest`` found only another run's checkpoints.
            PurposeError: the artifact cannot serve the use.
            DriftError: ``checkpoint.strict_resume`` and something changed (RollbackError:
                the newest checkpoint the run committed is gone).
            IncompatibleStateError: it does not fit ``state``; nothing was changed.
        """
        self._lock = begin.prepare(self.run_dir, self.world, self._journal_path())
        try:
            return self._restore(state, resume_spec, init_from)
        except BaseException:
            self._release()
            raise

    def _restore(self, state: TrainState, resume_spec: object, init_from: object) -> int:
        if resume_spec is not None:
            loaded, replaced = begin.choose(
                self.run_dir,
                resume_spec,
                self.trust,
                allow_untrusted=self.allow_untrusted,
                journal=self._journal_path(),
                strict=self.cfg.strict_resume,
            )
            if loaded is not None:
                step = self._resume(state, loaded, replaced)
                if resume.parse_spec(resume_spec) != resume.LATEST and self.world.leader:
                    branches.abandon(self.run_dir, step, self._event)  # a branch from here
                distributed.barrier()
                return step
        else:
            begin.refuse_reuse(self.run_dir)
        self.identity, event = begin.new_run(
            state, init_from, self.run_id, self.trust, self.allow_untrusted, root=self.root
        )
        self._event(event)
        return 0

    def _resume(self, state: TrainState, loaded: resume.Loaded, replaced: str | None) -> int:
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
        self.identity = ident
        self.last_saved = ident.step
        self._event(begin.resume_event(loaded, ident, self.world.size, replaced=replaced))
        return ident.step

    @property
    def run_id(self) -> str:
        """The run's id (kept across resumes; new for a fresh or warm-started run)."""
        return self.identity.run_id

    @property
    def resumed_from(self) -> Path | None:
        """The checkpoint this process resumed from, if it did."""
        return self.identity.resumed_from

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _journal_path(self) -> Path:
        # ranks > 0 journal nothing but read the same file: every rank takes one decision
        return (self.journal.path if self.journal else None) or self.run_dir / METRICS_FILE

    def _event(self, record: dict[str, Any]) -> None:
        if self.journal is not None:
            self.journal.write(record)
