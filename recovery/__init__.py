"""recovery: exact, verified recovery of PyTorch training runs.

Everything an own training loop needs: a :class:`TrainState` of the run's
stateful pieces (with declared absences), a :class:`Checkpointer` that saves
and restores it atomically, signed, with sensible defaults (the dev key, the
journal in the run directory, preemption signals), the data position
(:class:`ResumableLoader`, :class:`ResumableSampler`), the journal's per-step
record (:meth:`Checkpointer.record`, :class:`Journal`), the resume health
monitor, the trackers that follow the journal (:func:`attach_trackers`: TensorBoard,
MLflow), the verifying reader and the errors it raises. See README.md for the
formats and the CLI.

The names are imported on first use (the errors and the version at once), so
``import recovery`` costs no torch until one is used.
"""

import importlib
from typing import TYPE_CHECKING, Any

from recovery.errors import (
    CheckpointNotFoundError,
    CommitError,
    ConfigError,
    IncompatibleStateError,
    InexactResumeError,
    Preempted,
    PurposeError,
    RecoveryError,
    VerificationError,
)
from recovery.version import __version__ as __version__

if TYPE_CHECKING:  # the lazily imported names, for type checkers and IDEs
    from recovery.config import (
        CheckpointConfig,
        ClusterConfig,
        HealthConfig,
        ResumeCheckConfig,
        RunConfig,
        TrainConfig,
    )
    from recovery.integrity.reads.reader import read_verified
    from recovery.run.checkpointer import Checkpointer
    from recovery.run.journal import Journal
    from recovery.run.restoring.choose import select
    from recovery.run.scheduling.preemption import PreemptionGuard
    from recovery.run.trackers import MlflowConfig, TensorBoardConfig, TrackersConfig
    from recovery.run.trackers import attach as attach_trackers
    from recovery.state.health import HealthMonitor
    from recovery.state.loader import ResumableLoader
    from recovery.state.loop import LoopState
    from recovery.state.registry import Stateful, TrainState
    from recovery.state.sampler import ResumableSampler
    from recovery.tools.export import load_inference

_LAZY: dict[str, tuple[str, str]] = {
    "CheckpointConfig": ("recovery.config", "CheckpointConfig"),
    "ClusterConfig": ("recovery.config", "ClusterConfig"),
    "HealthConfig": ("recovery.config", "HealthConfig"),
    "ResumeCheckConfig": ("recovery.config", "ResumeCheckConfig"),
    "RunConfig": ("recovery.config", "RunConfig"),
    "TrainConfig": ("recovery.config", "TrainConfig"),
    "read_verified": ("recovery.integrity.reads.reader", "read_verified"),
    "Checkpointer": ("recovery.run.checkpointer", "Checkpointer"),
    "Journal": ("recovery.run.journal", "Journal"),
    "PreemptionGuard": ("recovery.run.scheduling.preemption", "PreemptionGuard"),
    "select": ("recovery.run.restoring.choose", "select"),
    "MlflowConfig": ("recovery.run.trackers", "MlflowConfig"),
    "TensorBoardConfig": ("recovery.run.trackers", "TensorBoardConfig"),
    "TrackersConfig": ("recovery.run.trackers", "TrackersConfig"),
    "attach_trackers": ("recovery.run.trackers", "attach"),
    "HealthMonitor": ("recovery.state.health", "HealthMonitor"),
    "ResumableLoader": ("recovery.state.loader", "ResumableLoader"),
    "LoopState": ("recovery.state.loop", "LoopState"),
    "Stateful": ("recovery.state.registry", "Stateful"),
    "TrainState": ("recovery.state.registry", "TrainState"),
    "ResumableSampler": ("recovery.state.sampler", "ResumableSampler"),
    "load_inference": ("recovery.tools.export", "load_inference"),
}
"""Public name -> (module, attribute), imported on first use (:func:`__getattr__`)."""


def __getattr__(name: str) -> Any:
    """A public name's object, its module imported now: ``import recovery`` (and the CLI,
    which imports it first) does not pay for torch until something needs tensors."""
    if name not in _LAZY:
        raise AttributeError(f"module 'recovery' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CheckpointConfig",
    "CheckpointNotFoundError",
    "Checkpointer",
    "ClusterConfig",
    "CommitError",
    "ConfigError",
    "HealthConfig",
    "HealthMonitor",
    "IncompatibleStateError",
    "InexactResumeError",
    "Journal",
    "LoopState",
    "MlflowConfig",
    "Preempted",
    "PreemptionGuard",
    "PurposeError",
    "RecoveryError",
    "ResumableLoader",
    "ResumableSampler",
    "ResumeCheckConfig",
    "RunConfig",
    "Stateful",
    "TensorBoardConfig",
    "TrackersConfig",
    "TrainConfig",
    "TrainState",
    "VerificationError",
    "attach_trackers",
    "load_inference",
    "read_verified",
    "select",
]
