"""Trackers: TensorBoard and MLflow, as observers of the run's journal.

Every per-step record and every event (start, resume, checkpoint with its costs
and lineage, the self-check's verdicts, preemption, the run's summary) passes
through the journal (:class:`~recovery.run.journal.Journal`), so a tracker
needs no hook of its own in the loop or the checkpointer: :func:`attach` taps
the journal (:meth:`~recovery.run.journal.Journal.tap`) before the run restores,
and the recipes and an own loop get the same records. The journal stays the
record of truth: a tracker that fails is turned off with one warning and the
run goes on (:mod:`recovery.run.trackers.base`).

Rejected: callbacks in the training loop (a second path for the same numbers,
which an own loop would have to call), and a tracker reading ``metrics.jsonl``
after the fact (no live view, and nothing while a run is killed and resumed).
"""

from __future__ import annotations

import logging
from pathlib import Path

from recovery.config import SigningConfig
from recovery.errors import ConfigError, RecoveryError
from recovery.run.journal import Journal, Observer
from recovery.run.trackers.config import MlflowConfig, TensorBoardConfig, TrackersConfig

__all__ = [
    "MlflowConfig",
    "TensorBoardConfig",
    "TrackersConfig",
    "attach",
    "log_dir",
    "register_export",
]

log = logging.getLogger(__name__)

DEFAULT_PARENT = "runs"
"""TensorBoard's usual parent directory: the default log directory is ``runs/<run name>``."""


def log_dir(cfg: TensorBoardConfig, run_dir: Path, run_name: str | None = None) -> Path:
    """Where the run at ``run_dir`` writes its event files: ``trackers.tensorboard.log_dir``,
    or ``runs/<run_name>`` (default: the run directory's name). The recipes pass the run's
    whole name (a sweep job's ``<run.name>.sweep/<overrides>``), so two runs never share
    a directory, whose restart markers would drop each other's points.

    Raises:
        ConfigError: the directory is inside the run directory (which holds only the run).
    """
    where = Path(cfg.log_dir) if cfg.log_dir else Path(DEFAULT_PARENT) / (run_name or run_dir.name)
    inside = where.resolve().is_relative_to(run_dir.resolve())
    if inside:
        raise ConfigError(
            f"trackers.tensorboard.log_dir: {where} is inside the run directory {run_dir}, "
            "which holds only the run; choose a directory outside it"
        )
    return where


def attach(
    journal: Journal, cfg: TrackersConfig, *, run_dir: Path, run_name: str | None = None
) -> list[Observer]:
    """Tap ``journal`` with the trackers ``cfg`` enables; return them (none: nothing is
    imported or written). Call it before the run restores, so they see its start or
    resume; they end when the journal closes. Only the process that writes the journal
    (rank 0) tracks: a journal that discards its records gets none.

    Args:
        journal: the run's journal (a checkpointer's ``ckpt.journal``).
        cfg: which trackers, and where.
        run_dir: the run directory (the default TensorBoard directory is named by it).
        run_name: the run's name (the MLflow run's, and the default TensorBoard directory
            under ``runs/``); default: the run directory's name.

    Raises:
        ConfigError: the TensorBoard directory is inside the run directory.
    """
    if journal.path is None or not cfg.any:
        return []
    trackers: list[Observer] = []
    if cfg.tensorboard.enabled:
        from recovery.run.trackers.tensorboard import TensorBoardTracker

        trackers.append(TensorBoardTracker(log_dir(cfg.tensorboard, run_dir, run_name)))
    if cfg.mlflow.enabled:
        from recovery.run.trackers.mlflow import MlflowTracker

        trackers.append(MlflowTracker(cfg.mlflow, journal, run_name=run_name or run_dir.name))
    for tracker in trackers:
        journal.tap(tracker)
    return trackers


def register_export(
    cfg: TrackersConfig, signing: SigningConfig, out: Path, *, run_dir: Path
) -> str | None:
    """With MLflow enabled, log the export at ``out`` to the MLflow run of the run at
    ``run_dir`` and register it as a model version carrying its signature bundle
    (:mod:`recovery.run.trackers.exports`); return the version. A
    tracking failure is one warning and ``None``: the export stands.

    Raises:
        VerificationError: ``out`` is not signed by a key ``signing`` trusts.
    """
    if not cfg.mlflow.enabled:
        return None
    from recovery.integrity.keys import trust
    from recovery.run.trackers import exports

    keys = trust.resolve_trust(signing, trust.resolve_signer(signing))
    try:
        return exports.register_export(
            cfg.mlflow, out, run_dir=run_dir, trust=keys, run_name=run_dir.name
        )
    except RecoveryError:
        raise
    except Exception as err:  # the tracker's failure is not the export's
        log.warning("MLflow: the export %s was not registered: %s", out, err)
        return None
