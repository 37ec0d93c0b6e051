"""Typed schemas for the config groups, validated once at the edge.

Hydra composes plain YAML; :func:`typed` merges a composed node onto its
dataclass schema (OmegaConf checks key names and types) and builds the
dataclass, whose ``__post_init__`` checks ranges. After that, code receives
dataclasses, never raw config nodes. Only :func:`typed` needs OmegaConf (the
``[hydra]`` extra): an own loop builds the dataclasses directly.

Every refusal is one :class:`~recovery.errors.ConfigError` line naming the key, what was
expected, what was found and a valid value to set (:mod:`recovery.config.checks`).
"""

from __future__ import annotations

from recovery.config.checkpoint import (
    TIMING_KEYS,
    CheckpointConfig,
    DifferentialConfig,
    DvcConfig,
    LocalConfig,
    ResumeCheckConfig,
)
from recovery.config.checks import (
    SEED_MAX,
    check_seed,
    did_you_mean,
    parse_duration,
    refuse,
)
from recovery.config.cluster import ClusterConfig
from recovery.config.groups import (
    BACKTESTS,
    PARAMS_PER_THREAD,
    STRATEGIES,
    THREADS_AUTO,
    DistConfig,
    DrillConfig,
    HealthConfig,
    RunConfig,
    SigningConfig,
    TrainConfig,
    available_cpus,
    check_threads,
    intra_op_threads,
)
from recovery.config.schema import typed

__all__ = [
    "BACKTESTS",
    "PARAMS_PER_THREAD",
    "SEED_MAX",
    "STRATEGIES",
    "THREADS_AUTO",
    "TIMING_KEYS",
    "CheckpointConfig",
    "ClusterConfig",
    "DifferentialConfig",
    "DistConfig",
    "DrillConfig",
    "DvcConfig",
    "HealthConfig",
    "LocalConfig",
    "ResumeCheckConfig",
    "RunConfig",
    "SigningConfig",
    "TrainConfig",
    "available_cpus",
    "check_seed",
    "check_threads",
    "did_you_mean",
    "intra_op_threads",
    "parse_duration",
    "refuse",
    "typed",
]
