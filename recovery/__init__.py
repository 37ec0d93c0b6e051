"""recovery: exact, verified recovery of PyTorch training runs.

The public surface is small: a :class:`TrainState` of the run's stateful
pieces, a :class:`Checkpointer` that saves and restores it atomically, a
:class:`ResumableSampler` whose data position is part of that state, and the
verifying reader. See README.md for the formats and the CLI.
"""

from recovery.checkpointer import Checkpointer
from recovery.config import CheckpointConfig, RunConfig, TrainConfig
from recovery.export import load_inference
from recovery.journal import Journal
from recovery.reader import read_verified
from recovery.resume import select
from recovery.sampler import ResumableSampler
from recovery.state import Stateful, TrainState

__all__ = [
    "CheckpointConfig",
    "Checkpointer",
    "Journal",
    "ResumableSampler",
    "RunConfig",
    "Stateful",
    "TrainConfig",
    "TrainState",
    "load_inference",
    "read_verified",
    "select",
]
__version__ = "0.1.0"
