"""The checkpoint lifecycle of one run: restore, should-save, snapshot, commit, retain.

The checkpointer owns a run directory. It never decides *what* the state is
(that is :class:`~recovery.state.TrainState`) nor *how* bytes reach the disk
(that is :mod:`recovery.commit`); it wires the policies in
:mod:`recovery.policy` to them. One process writes a run directory at a time.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from recovery import commit, policy, resume, snapshot
from recovery.config import CheckpointConfig
from recovery.errors import RunDirInUseError
from recovery.journal import Journal
from recovery.layout import scan, step_dir_name
from recovery.manifest import Manifest
from recovery.state import TrainState

log = logging.getLogger(__name__)

CONTINUATION = "continuation"


class Checkpointer:
    """Saves and restores one run's :class:`TrainState`.

    Args:
        cfg: checkpoint settings.
        run_dir: ``<checkpoint.root>/<run.name>``.
        final_step: the run's last step; a checkpoint is always written there.
        config_yaml: the resolved config, stored in every checkpoint.
        journal: the run's ``metrics.jsonl``; resume events are appended to it.
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        run_dir: Path,
        *,
        final_step: int,
        config_yaml: str | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.final_step = final_step
        self.config_yaml = config_yaml
        self.journal = journal
        self.run_id = uuid.uuid4().hex
        self.last_saved: int | None = None
        self.previous: Manifest | None = None
        self.resumed_from: Path | None = None

    def restore(self, state: TrainState, spec: object | None) -> int:
        """Restore ``state`` as ``spec`` (``+resume=``) asks; return the step to start from.

        With ``spec`` ``None`` the run is fresh: step 0, and the run directory
        must not already hold checkpoints (that would mix two runs).

        Raises:
            RunDirInUseError: fresh run into a directory holding checkpoints.
            CheckpointNotFoundError, VerificationError, FormatError: a named
                checkpoint is absent or damaged.
            IncompatibleStateError: the checkpoint does not fit ``state``;
                nothing was changed.
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        commit.remove_stale(self.run_dir)
        if spec is None:
            committed = scan(self.run_dir).committed
            if committed:
                raise RunDirInUseError(
                    f"{self.run_dir}: already holds checkpoints up to step {committed[-1][0]}. "
                    "Pass +resume=latest to continue that run, or choose another run.name= "
                    "(or checkpoint.root=) for a new one.",
                    path=self.run_dir,
                )
            self._record_start()
            return 0
        loaded = resume.select(self.run_dir, spec)
        if loaded is None:
            self._record_start()
            return 0
        state.load_state_dict(loaded.decoded.tree, source=str(loaded.path))
        self.run_id = str(loaded.decoded.meta.get("run_id", self.run_id))
        self.last_saved = loaded.decoded.step
        self.previous = loaded.manifest
        self.resumed_from = loaded.path
        log.info("resumed from %s at step %d", loaded.path, loaded.decoded.step)
        if self.journal is not None:
            self.journal.write(
                {
                    "event": "resume",
                    "from": str(loaded.path),
                    "step": loaded.decoded.step,
                    "skipped": [str(p) for p, _ in loaded.skipped],
                }
            )
        return loaded.decoded.step

    def _record_start(self) -> None:
        if self.journal is not None:
            self.journal.write({"event": "start", "run_id": self.run_id})

    def maybe_save(
        self, state: TrainState, step: int, *, metrics: dict[str, Any] | None = None
    ) -> Path | None:
        """Save if the policy says so after ``step``; return the committed path or ``None``."""
        if not policy.should_save(
            step,
            every_steps=self.cfg.every_steps,
            final_step=self.final_step,
            last_saved=self.last_saved,
        ):
            return None
        return self.save(state, step, metrics=metrics)

    def save(self, state: TrainState, step: int, *, metrics: dict[str, Any] | None = None) -> Path:
        """Snapshot ``state`` at ``step``, commit it atomically, then apply retention.

        Raises:
            CommitError: the write failed; earlier checkpoints are intact.
        """
        started = time.time()
        tree = state.state_dict()
        meta = {"run_id": self.run_id, "metrics": dict(metrics or {})}
        files = snapshot.encode(tree, step=step, meta=meta, config_yaml=self.config_yaml)
        previous = (
            {"name": self.previous.subject, "sha256": self.previous.root} if self.previous else None
        )
        final = self.run_dir / step_dir_name(step)
        committed = commit.commit(
            final,
            files,
            {
                "step": step,
                "purpose": CONTINUATION,
                "run_id": self.run_id,
                "metrics": dict(metrics or {}),
                "previous": previous,
                "started_at": started,
                "committed_at": time.time(),
            },
        )
        self.last_saved = step
        self.previous = committed
        log.info("checkpoint %s committed (%.3fs)", final, time.time() - started)
        self._retain(step)
        return final

    def _retain(self, newest: int) -> None:
        listing = scan(self.run_dir)
        paths = dict(listing.committed)
        doomed = policy.to_delete(
            paths, newest=newest, keep_last=self.cfg.keep_last, keep_every=self.cfg.keep_every
        )
        for step in doomed:
            log.info("retention: removing %s", paths[step])
            shutil.rmtree(paths[step], ignore_errors=True)

    def close(self) -> None:
        """Finish pending work (none yet: saves are synchronous)."""
