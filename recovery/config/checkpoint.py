"""``checkpoint.*``: where and when checkpoints are written, and which are kept."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import ClassVar

from recovery.config.checks import (
    at_least,
    check_duration,
    check_exit_code,
    check_signals,
    not_empty,
    one_of,
    refuse,
)
from recovery.config.cluster import ClusterConfig
from recovery.errors import ConfigError


@dataclass(kw_only=True)
class DvcConfig:
    """DVC tracking of committed checkpoints."""

    enabled: bool = True
    """Register each committed checkpoint with DVC when the checkpoint root is in a DVC repo."""
    push: bool = False
    """Also push each registered checkpoint to the remote."""
    remote: str | None = None
    """Remote name; unset: the repository's default remote."""
    close_timeout: str = "120s"
    """How long the end of a run waits for pending registrations and pushes."""

    def __post_init__(self) -> None:
        not_empty("checkpoint.dvc.remote", self.remote, "null")
        check_duration("checkpoint.dvc.close_timeout", self.close_timeout, "120s")


@dataclass(kw_only=True)
class DifferentialConfig:
    """``checkpoint.differential``: checkpoints that write only the table rows that changed."""

    enabled: bool = False
    """Write a *delta* (the rows of each large table, parameters and optimizer state, that
    differ from an earlier checkpoint, its *base*) instead of a full checkpoint."""
    full_every: int = 20
    """Every this many saves is a full checkpoint (1: every save), which starts a new chain;
    a chain holds at most ``full_every - 1`` deltas."""
    against: str = "previous"
    """A delta's base: ``previous`` (the checkpoint before it, full or a delta: a chain,
    and only the rows changed since that save) or ``full`` (the chain's full checkpoint:
    each delta holds every row changed since it, larger, but a resume reads two links)."""
    min_mb: float = 1.0
    """A tensor with at least this many MiB (and rows) is compared row by row; smaller
    ones are written whole."""

    def __post_init__(self) -> None:
        key = "checkpoint.differential"
        at_least(f"{key}.full_every", self.full_every, 1, 10, " (1: every save is full)")
        one_of(f"{key}.against", self.against, ("previous", "full"))
        at_least(f"{key}.min_mb", self.min_mb, 0, 1)

    @property
    def min_bytes(self) -> int:
        """``min_mb`` in bytes."""
        return int(self.min_mb * (1 << 20))


@dataclass(kw_only=True)
class LocalConfig:
    """``checkpoint.local``: the local tier, snapshots in node-local RAM between the
    persistent checkpoints (:mod:`recovery.run.tiers.rules`)."""

    every_steps: int = 0
    """Snapshot into ``root`` every this many optimizer steps; 0: no local tier. Every
    persistent checkpoint is then a promoted local snapshot (no second pause; under torchrun
    every rank's, written by the collective save in the background)."""
    root: str = "/dev/shm/recovery-{uid}"
    """The node-local directory (RAM by default; ``{uid}``: the user's id, so that each user
    has a root of their own); each run directory gets its own
    ``<root>/<run name>-<digest of its path>/rank<r>/``, every directory this user's, mode 0700."""
    replicas: int = 1
    """Under ``torchrun``: how many other ranks hold a copy of each rank's newest snapshot
    (sent in the background), so a job whose node lost its RAM restores it from a peer;
    0: none (a lost node falls back to the persistent tier). Ignored in one process."""
    replica_spacing: int = 0
    """Under ``torchrun``: rank ``r``'s copies go to ranks ``r + k * spacing`` (k = 1 ..
    ``replicas``, modulo the world size); 0: the ranks per node (``LOCAL_WORLD_SIZE``), so
    each copy is on another node."""

    def __post_init__(self) -> None:
        at_least("checkpoint.local.every_steps", self.every_steps, 0, 10, " (0: no local tier)")
        at_least("checkpoint.local.replicas", self.replicas, 0, 1, " (0: no peer replicas)")
        at_least(
            "checkpoint.local.replica_spacing", self.replica_spacing, 0, 8, " (0: ranks per node)"
        )
        if not str(self.root).strip():
            raise refuse(
                "checkpoint.local.root",
                "must be a directory path, got an empty string",
                "/dev/shm/recovery-{uid}",
            )

    @property
    def enabled(self) -> bool:
        """Whether the run keeps a local tier."""
        return self.every_steps > 0


# fmt: off
TIMING_KEYS = ("time", "dt", "elapsed", "wall", "wall_s", "step_time", "duration", "mfu",
               "throughput", "tokens_per_s", "samples_per_s", "it_per_s", "mem", "memory")
# fmt: on
"""Per-step record fields that measure the machine, not the run: never compared."""


FINGERPRINT_AUTO, FINGERPRINT_OFF = "auto", "off"


def fingerprint_every(value: object) -> int | None:
    """``checkpoint.resume_check.fingerprint`` as a step count: ``None`` for ``auto``, 0 for
    ``off``, else an integer from 1 (the schema's string ``"16"`` as 16).

    Raises:
        ConfigError: anything else.
    """
    text = str(value).strip().lower()
    if text == FINGERPRINT_AUTO:
        return None
    if text == FINGERPRINT_OFF:
        return 0
    if not isinstance(value, bool) and text.isascii() and text.isdigit() and int(text) >= 1:
        return int(text)
    raise refuse(
        "checkpoint.resume_check.fingerprint",
        f"expected {FINGERPRINT_AUTO}, {FINGERPRINT_OFF} or a step count from 1, got {value!r}",
        FINGERPRINT_AUTO,
    )


@dataclass(kw_only=True)
class ResumeCheckConfig:
    """``checkpoint.resume_check``: each resume's redone steps against the record of the run
    that died (:mod:`recovery.run.restoring.selfcheck`)."""

    enabled: bool = True
    """Compare the redone steps (it reads nothing the resume does not read already)."""
    rtol: float = 0.0
    """Relative tolerance of a number (0: bit-identical, the CPU default)."""
    atol: float = 0.0
    """Absolute tolerance of a number (non-deterministic GPU kernels: set both)."""
    strict: bool = False
    """Stop at the first differing step (``InexactResumeError``, exit 30), unsaved."""
    ignore: list[str] = field(default_factory=lambda: list(TIMING_KEYS))
    """Record fields never compared (timings and throughput, which measure the machine)."""
    fingerprint: str = FINGERPRINT_AUTO
    """How often the per-step record carries a fingerprint of the registered modules'
    parameters and buffers, compared at redone steps: every ``K`` steps (an integer),
    ``off``, or ``auto``: as often as costs under 1 % of the steps it covers
    (:mod:`recovery.run.monitoring.fingerprint`)."""

    def __post_init__(self) -> None:
        key = "checkpoint.resume_check"
        if not (self.rtol >= 0 and self.atol >= 0):  # NaN too
            raise ConfigError(
                f"{key}.rtol/atol: must be >= 0, got {self.rtol}, {self.atol}; set e.g. "
                f"{key}.rtol=0 {key}.atol=0"
            )
        fingerprint_every(self.fingerprint)
        if not all(isinstance(k, str) for k in self.ignore):
            raise refuse(
                f"{key}.ignore", f"expected a list of field names, got {self.ignore!r}", "[time,dt]"
            )


@dataclass(kw_only=True)
class CheckpointConfig:
    """Where and when checkpoints are written, and which are kept."""

    root: str = "checkpoints"
    """Directory holding one sub-directory per run (``<root>/<run.name>``)."""
    every_steps: int = 100
    """Save after every multiple of this many optimizer steps; 0 saves only at the end."""
    keep_last: int = 3
    """How many recent checkpoints to keep; at least 2, so a corrupt newest one has a fallback."""
    keep_every: int = 0
    """Steps that are multiples of this are milestones, kept forever; 0 keeps none."""
    warm_start_every: int = 0
    """Also write a warm-start artifact (weights + model config) every this many steps; 0: never."""
    strict_resume: bool = False
    """Refuse a resume whose code, dependencies, dataset or config differ from the checkpoint's."""
    async_save: bool = False
    """``checkpoint.async``: pause only to copy the state into reused host buffers; a
    background thread serialises, hashes, signs and commits."""
    every_seconds: float = 0.0
    """Also save when this many seconds passed since the last save; 0: off."""
    interval: str = "fixed"
    """``fixed`` (every_steps / every_seconds) or ``auto``: the Young/Daly interval
    sqrt(2 * cost * mtbf) from measured save costs."""
    mtbf: str = "24h"
    """Mean time between failures for ``interval=auto`` (``90m``, ``24h``, ``2d``)."""
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])
    """Signals that mean "checkpoint at the next step boundary and exit
    ``preempt_exit_code``"."""
    preempt_exit_code: int = 75
    """The exit code of a preempted run ("checkpointed, requeue me"): 75 (EX_TEMPFAIL); 32
    to 255, never one of recovery's own error codes (1 to 31). Kubeflow's ``restartPolicy:
    ExitCode`` retries only 128 to 255: set e.g. 143 there."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """The batch scheduler the run is under: its job names the run, each start is
    journaled, and the run may requeue its own job (:mod:`recovery.run.scheduling.slurm`)."""
    dvc: DvcConfig = field(default_factory=DvcConfig)
    """DVC tracking of committed checkpoints."""
    keep_best: bool = False
    """Keep an independent copy of the best checkpoint by ``best_metric`` under ``<run>/best/``."""
    best_metric: str | None = None
    """The metric (recorded with each checkpoint) that ranks checkpoints; unset: the
    recipe's own (an own loop with ``keep_best`` names it)."""
    best_mode: str = "min"
    """``min`` or ``max``: which direction of ``best_metric`` is better."""
    shard_mb: float = 256.0
    """A component with more tensor bytes than this (MiB) is written as Hugging Face-style
    shards plus an index, so its files are written, read and hashed on every core at
    once; 0: one file per component."""
    hash: str = "sha256"
    """Every file's digest: ``sha256`` (what the ``model_signing verify key`` CLI checks)
    or ``blake3`` (about 4x faster per core; verified by model-signing's Python API and
    by recovery; needs ``recovery[blake3]``)."""

    differential: DifferentialConfig = field(default_factory=DifferentialConfig)
    """Differential checkpoints (deltas of a full base)."""
    resume_check: ResumeCheckConfig = field(default_factory=ResumeCheckConfig)
    """The self-check of every resume: redone steps against the dead run's record."""
    local: LocalConfig = field(default_factory=LocalConfig)
    """The local tier (RAM snapshots every ``local.every_steps``; off by default)."""

    ALIASES: ClassVar[dict[str, str]] = {"async": "async_save"}

    def __post_init__(self) -> None:
        if not str(self.root).strip():
            raise refuse(
                "checkpoint.root", "must be a directory path, got an empty string", "checkpoints"
            )
        at_least("checkpoint.every_steps", self.every_steps, 0, 100, " (0: only at the end)")
        at_least(
            "checkpoint.keep_last",
            self.keep_last,
            2,
            3,
            " so a corrupt newest checkpoint has a verified fallback",
        )
        at_least("checkpoint.keep_every", self.keep_every, 0, 0, " (0: no milestones)")
        at_least("checkpoint.warm_start_every", self.warm_start_every, 0, 0, " (0: never)")
        at_least("checkpoint.every_seconds", self.every_seconds, 0, 0, " (0: off)")
        at_least("checkpoint.shard_mb", self.shard_mb, 0, 256, " (0: never shard)")
        one_of("checkpoint.best_mode", self.best_mode, ("min", "max"))
        one_of("checkpoint.interval", self.interval, ("fixed", "auto"))
        one_of("checkpoint.hash", self.hash, ("sha256", "blake3"))
        check_duration("checkpoint.mtbf", self.mtbf, "24h")
        check_signals("checkpoint.preempt_signals", self.preempt_signals)
        check_exit_code("checkpoint.preempt_exit_code", self.preempt_exit_code)
        self.cluster.check_caught(self.preempt_signals)
        not_empty("checkpoint.best_metric", self.best_metric, "val_loss")
        if self.hash == "blake3" and importlib.util.find_spec("blake3") is None:
            raise refuse(
                "checkpoint.hash",
                "blake3 needs the blake3 package, which is not installed: pip install -e "
                "'.[blake3]' (in the recovery checkout), or keep sha256",
                "sha256",
            )

    @property
    def shard_bytes(self) -> int:
        """``shard_mb`` in bytes (0: never shard)."""
        return int(self.shard_mb * (1 << 20))
