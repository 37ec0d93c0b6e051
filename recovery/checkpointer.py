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
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from recovery import commit, lineage, policy, purpose, resume, snapshot
from recovery import provenance as prov
from recovery.config import CheckpointConfig
from recovery.errors import DriftError, PurposeError, RunDirInUseError
from recovery.journal import Journal
from recovery.layout import CONFIG_FILE, scan, step_dir_name
from recovery.purpose import BUILTIN, PurposeSpec
from recovery.signing import Signer, TrustStore
from recovery.state import MODEL, TrainState

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
        journal: the run's ``metrics.jsonl``; start and resume events go there.
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
    ) -> None:
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
        self.run_dir.mkdir(parents=True, exist_ok=True)
        commit.remove_stale(self.run_dir)
        if resume_spec is not None:
            loaded = resume.select(
                self.run_dir, resume_spec, self.trust, allow_untrusted=self.allow_untrusted
            )
            if loaded is not None:
                return self._resume(state, loaded)
        elif scan(self.run_dir).committed:
            newest = scan(self.run_dir).committed[-1][0]
            raise RunDirInUseError(
                f"{self.run_dir}: already holds checkpoints up to step {newest}. "
                "Pass +resume=latest to continue that run, or choose another run.name= "
                "(or checkpoint.root=) for a new one.",
                path=self.run_dir,
            )
        if init_from is not None:
            return self._warm_start(state, Path(str(init_from)))
        self.lineage = [lineage.segment(lineage.START, self.run_id, 0, None)]
        self._event({"event": "start", "run_id": self.run_id})
        return 0

    def _resume(self, state: TrainState, loaded: resume.Loaded) -> int:
        rec = loaded.manifest.recovery
        old_config = _yaml(loaded.files.get(CONFIG_FILE))
        self.drift = prov.drift(
            rec.get("provenance", {}),
            self.provenance,
            old_config=old_config,
            new_config=self.config,
        )
        for line in self.drift:
            log.warning("DRIFT since %s: %s", loaded.path.name, line)
        if self.drift and self.cfg.strict_resume:
            raise DriftError(
                f"{loaded.path}: refusing to resume (checkpoint.strict_resume=true); "
                f"{len(self.drift)} differences:\n  "
                + "\n  ".join(self.drift)
                + "\nRestore the original code, dependencies, data and config, "
                "or resume without strict mode.",
                differences=self.drift,
                path=loaded.path,
            )
        state.load_state_dict(loaded.decoded.tree, source=str(loaded.path))
        step = loaded.decoded.step
        self.run_id = str(rec.get("run_id") or self.run_id)
        source = lineage.link(loaded.manifest, loaded.path, self.root)
        self.lineage = [
            *rec.get("lineage", []),
            lineage.segment(lineage.RESUME, self.run_id, step, source, drift=self.drift),
        ]
        self.previous = source
        self.parent = {"kind": lineage.RESUME, **source}
        self.last_saved = step
        self.resumed_from = loaded.path
        log.info("resumed from %s at step %d", loaded.path, step)
        self._event(
            {
                "event": "resume",
                "from": str(loaded.path),
                "step": step,
                "skipped": [str(p) for p, _ in loaded.skipped],
                "drift": self.drift,
            }
        )
        return step

    def _warm_start(self, state: TrainState, path: Path) -> int:
        loaded = resume.load(path, self.trust, allow_untrusted=self.allow_untrusted)
        purpose.check_use(
            purpose.INIT, loaded.manifest.purpose, where=str(path), present=loaded.components
        )
        if MODEL not in loaded.decoded.tree:
            raise PurposeError(f"{path}: holds no model weights to start from", missing=[MODEL])
        state.load_state_dict(loaded.decoded.tree, source=str(path), only=[MODEL])
        source = lineage.link(loaded.manifest, path, self.root)
        self.lineage = [
            *loaded.manifest.recovery.get("lineage", []),
            lineage.segment(lineage.WARM_START, self.run_id, 0, source),
        ]
        self.parent = {"kind": lineage.WARM_START, **source}
        log.info("warm start: new run %s initialised from %s", self.run_id, path)
        self._event({"event": "warm_start", "run_id": self.run_id, "from": str(path)})
        return 0

    # -- save ------------------------------------------------------------------

    def maybe_save(
        self, state: TrainState, step: int, *, metrics: dict[str, Any] | None = None
    ) -> Path | None:
        """Save if the policy says so after ``step``; return the committed path or ``None``."""
        every = self.cfg.warm_start_every
        if every > 0 and step % every == 0:
            self.save_warm_start(state, step, metrics=metrics)
        if not policy.should_save(
            step,
            every_steps=self.cfg.every_steps,
            final_step=self.final_step,
            last_saved=self.last_saved,
        ):
            return None
        return self.save(state, step, metrics=metrics)

    def save(self, state: TrainState, step: int, *, metrics: dict[str, Any] | None = None) -> Path:
        """Snapshot ``state`` at ``step`` as a continuation checkpoint, commit, retain.

        Raises:
            PurposeError: ``state`` lacks what a continuation checkpoint requires.
            CommitError: the write failed; earlier checkpoints are intact.
        """
        final = self.run_dir / step_dir_name(step)
        mf = self._write(final, state.state_dict(), step, purpose.CONTINUATION, metrics)
        self.last_saved = step
        self.previous = lineage.link(mf, final, self.root)
        self._retain(step)
        return final

    def save_warm_start(
        self, state: TrainState, step: int, *, metrics: dict[str, Any] | None = None
    ) -> Path:
        """Write a warm-start artifact (weights + model config) under ``warm_start/``."""
        model = state.components.get(MODEL)
        if model is None:
            raise PurposeError("warm-start artifacts need a registered 'model'", missing=[MODEL])
        final = self.run_dir / WARM_START_DIR / step_dir_name(step)
        final.parent.mkdir(exist_ok=True)
        self._write(final, {MODEL: model.state_dict()}, step, purpose.WARM_START, metrics)
        return final

    def _write(
        self,
        final: Path,
        tree: dict[str, Any],
        step: int,
        purpose_name: str,
        metrics: dict[str, Any] | None,
    ) -> Any:
        started = time.time()
        spec = self.purposes[purpose_name]
        meta: dict[str, Any] = {"run_id": self.run_id, "metrics": dict(metrics or {})}
        if self.model_config is not None:
            meta[snapshot.MODEL_CONFIG] = self.model_config
        config_yaml = yaml.safe_dump(self.config, sort_keys=False)
        files = snapshot.encode(tree, step=step, meta=meta, config_yaml=config_yaml)
        statement = {
            "step": step,
            "purpose": purpose_name,
            "requires": list(spec.requires),
            "run_id": self.run_id,
            "segment": len(self.lineage) - 1,
            "metrics": dict(metrics or {}),
            "previous": self.previous,
            "parent": self.parent,
            "lineage": self.lineage,
            # the drift this run segment resumed across travels with its provenance
            "provenance": {**self.provenance, "drift": self.drift}
            if self.drift
            else self.provenance,
            "started_at": started,
        }
        have = snapshot.present(tree, meta, files, statement)
        purpose.check_contract(purpose_name, spec.requires, have, where=str(final))
        statement["components"] = have
        mf = commit.commit(final, files, statement, signer=self.signer)
        log.info("%s %s committed (%.3fs)", purpose_name, final, time.time() - started)
        return mf

    def _retain(self, newest: int) -> None:
        paths = dict(scan(self.run_dir).committed)
        doomed = policy.to_delete(
            paths, newest=newest, keep_last=self.cfg.keep_last, keep_every=self.cfg.keep_every
        )
        for step in doomed:
            log.info("retention: removing %s", paths[step])
            shutil.rmtree(paths[step], ignore_errors=True)

    def _event(self, record: dict[str, Any]) -> None:
        if self.journal is not None:
            self.journal.write(record)

    def close(self) -> None:
        """Finish pending work (none yet: saves are synchronous)."""


def _yaml(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    doc = yaml.safe_load(data)
    return doc if isinstance(doc, dict) else None
