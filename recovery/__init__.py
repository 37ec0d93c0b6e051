"""recovery: exact, verified recovery of PyTorch training runs.

The public surface is small: a :class:`TrainState` of the run's stateful
pieces, a :class:`Checkpointer` that saves and restores it atomically, a
:class:`ResumableSampler` whose data position is part of that state, and the
verifying reader. See README.md for the formats and the CLI.
"""

from recovery.config import CheckpointConfig, RunConfig, TrainConfig
from recovery.integrity.reader import read_verified
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal
from recovery.run.resume import select
from recovery.state.loader import ResumableLoader
from recovery.state.registry import Stateful, TrainState
from recovery.state.sampler import ResumableSampler
from recovery.tools.export import load_inference
from recovery.version import __version__ as __version__

__all__ = [
    "CheckpointConfig",
    "Checkpointer",
    "Journal",
    "ResumableLoader",
    "ResumableSampler",
    "RunConfig",
    "Stateful",
    "TrainConfig",
    "TrainState",
    "load_inference",
    "read_verified",
    "select",
]
