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
"""

from recovery.config import (
    CheckpointConfig,
    HealthConfig,
    ResumeCheckConfig,
    RunConfig,
    TrainConfig,
)
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
from recovery.integrity.reader import read_verified
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal
from recovery.run.preemption import PreemptionGuard
from recovery.run.resume import select
from recovery.run.trackers import MlflowConfig, TensorBoardConfig, TrackersConfig
from recovery.run.trackers import attach as attach_trackers
from recovery.state.health import HealthMonitor
from recovery.state.loader import ResumableLoader
from recovery.state.loop import LoopState
from recovery.state.registry import Stateful, TrainState
from recovery.state.sampler import ResumableSampler
from recovery.tools.export import load_inference
from recovery.version import __version__ as __version__

__all__ = [
    "CheckpointConfig",
    "CheckpointNotFoundError",
    "Checkpointer",
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
