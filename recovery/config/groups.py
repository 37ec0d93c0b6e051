"""Typed schemas for the config groups, validated once at the edge.

Hydra composes plain YAML; :func:`typed` merges a composed node onto its
dataclass schema (OmegaConf checks key names and types) and builds the
dataclass, whose ``__post_init__`` checks ranges. After that, code receives
dataclasses, never raw config nodes. Only :func:`typed` needs OmegaConf (the
``[hydra]`` extra): an own loop builds the dataclasses directly.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from recovery.errors import ConfigError

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str | float | int) -> float:
    """Seconds in ``60``, ``90s``, ``5m``, ``24h`` or ``2d``.

    Raises:
        ValueError: not a positive duration.
    """
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        raw = str(text).strip().lower()
        unit = _UNITS.get(raw[-1:])
        number = raw[:-1] if unit is not None else raw
        try:
            value = float(number) * (unit or 1.0)
        except ValueError:
            raise ValueError(f"expected a duration like 60s, 5m, 24h or 2d, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"expected a positive duration, got {text!r}")
    return value


def did_you_mean(word: str, choices: list[str], *, prefix: str = "") -> str:
    """``; did you mean `prefix.choice`?`` for the choice closest to ``word``, or ``""``."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close:
        return ""
    return f"; did you mean `{prefix + '.' if prefix else ''}{close[0]}`?"


T = TypeVar("T")

BACKTESTS = 10
"""Past windows, at least, that measure the resume health band."""
STRATEGIES = ("ddp", "fsdp")
"""How a ``torchrun`` job parallelises: replicated (DDP) or sharded (FSDP2)."""

_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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
        try:
            parse_duration(self.close_timeout)
        except ValueError as err:
            raise ConfigError(f"checkpoint.dvc.close_timeout: {err}") from None


@dataclass(kw_only=True)
class DifferentialConfig:
    """``checkpoint.differential``: checkpoints that write only the table rows that changed."""

    enabled: bool = False
    """Write a *delta* (the rows of each large table, parameters and optimizer state, that
    differ from the last full checkpoint, its *base*) instead of a full checkpoint."""
    full_every: int = 10
    """Every this many saves is a full base (1: every save; the others are deltas of it)."""
    min_mb: float = 1.0
    """A tensor with at least this many MiB (and rows) is compared row by row; smaller
    ones are written whole."""

    def __post_init__(self) -> None:
        bounds = (("full_every", self.full_every, 1, " (1: every save is full)"),)
        for key, value, low, hint in (*bounds, ("min_mb", self.min_mb, 0, "")):
            if value < low:
                raise ConfigError(
                    f"checkpoint.differential.{key}: must be >= {low}{hint}, got {value}"
                )

    @property
    def min_bytes(self) -> int:
        """``min_mb`` in bytes."""
        return int(self.min_mb * (1 << 20))


# fmt: off
TIMING_KEYS = ("time", "dt", "elapsed", "wall", "wall_s", "step_time", "duration", "mfu",
               "throughput", "tokens_per_s", "samples_per_s", "it_per_s", "mem", "memory")
# fmt: on
"""Per-step record fields that measure the machine, not the run: never compared."""


@dataclass(kw_only=True)
class ResumeCheckConfig:
    """``checkpoint.resume_check``: each resume's redone steps against the record of the run
    that died (:mod:`recovery.run.selfcheck`)."""

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

    def __post_init__(self) -> None:
        key = "checkpoint.resume_check"
        if self.rtol < 0 or self.atol < 0:
            raise ConfigError(f"{key}.rtol/atol: must be >= 0, got {self.rtol}, {self.atol}")
        if not all(isinstance(k, str) for k in self.ignore):
            raise ConfigError(f"{key}.ignore: expected a list of field names, got {self.ignore!r}")


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
    """Signals that mean "checkpoint at the next step boundary and exit 75"."""
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

    ALIASES: ClassVar[dict[str, str]] = {"async": "async_save"}

    def __post_init__(self) -> None:
        if not self.root:
            raise ConfigError("checkpoint.root: must be a directory path, got an empty string")
        if self.every_steps < 0:
            raise ConfigError(f"checkpoint.every_steps: must be >= 0, got {self.every_steps}")
        if self.keep_last < 2:
            raise ConfigError(
                f"checkpoint.keep_last: must be >= 2 so a corrupt newest checkpoint "
                f"has a verified fallback, got {self.keep_last}"
            )
        if self.keep_every < 0:
            raise ConfigError(f"checkpoint.keep_every: must be >= 0, got {self.keep_every}")
        if self.best_mode not in ("min", "max"):
            raise ConfigError(f"checkpoint.best_mode: expected min or max, got {self.best_mode!r}")
        if self.every_seconds < 0:
            raise ConfigError(f"checkpoint.every_seconds: must be >= 0, got {self.every_seconds}")
        if self.interval not in ("fixed", "auto"):
            raise ConfigError(f"checkpoint.interval: expected fixed or auto, got {self.interval!r}")
        try:
            parse_duration(self.mtbf)
        except ValueError as err:
            raise ConfigError(f"checkpoint.mtbf: {err}") from None
        if self.warm_start_every < 0:
            raise ConfigError(
                f"checkpoint.warm_start_every: must be >= 0, got {self.warm_start_every}"
            )
        if self.shard_mb < 0:
            raise ConfigError(
                f"checkpoint.shard_mb: must be >= 0 (0: never shard), got {self.shard_mb}"
            )
        if self.hash not in ("sha256", "blake3"):
            raise ConfigError(f"checkpoint.hash: expected sha256 or blake3, got {self.hash!r}")
        if self.hash == "blake3" and importlib.util.find_spec("blake3") is None:
            raise ConfigError(
                "checkpoint.hash: blake3 needs the blake3 package, which is not installed; "
                "pip install 'recovery[blake3]', or keep checkpoint.hash=sha256"
            )

    @property
    def shard_bytes(self) -> int:
        """``shard_mb`` in bytes (0: never shard)."""
        return int(self.shard_mb * (1 << 20))


@dataclass(kw_only=True)
class RunConfig:
    """Identity of the run."""

    name: str = "default"
    """Run name; the run directory is ``<checkpoint.root>/<name>``."""

    def __post_init__(self) -> None:
        if not _RUN_NAME.match(self.name) or ".." in self.name:
            raise ConfigError(
                f"run.name: {self.name!r} must be a plain directory name "
                "(letters, digits, '.', '_', '-'; no '/')"
            )


@dataclass(kw_only=True)
class TrainConfig:
    """The length of the training loop."""

    steps: int = 1200
    """Total optimizer steps of the run (a resumed run continues up to this)."""
    log_every: int = 100
    """Log a progress line every this many steps."""

    def __post_init__(self) -> None:
        if self.steps <= 0:
            raise ConfigError(f"train.steps: must be positive, got {self.steps}")
        if self.log_every <= 0:
            raise ConfigError(f"train.log_every: must be positive, got {self.log_every}")


@dataclass(kw_only=True)
class SigningConfig:
    """Which key signs, and which public keys are trusted."""

    key: str | None = None
    """PEM private key that signs; env ``RECOVERY_SIGNING_KEY`` overrides; unset = the dev key."""
    trusted: str = ".recovery/trusted"
    """Directory of trusted public keys (``*.pub``/``*.pem``), besides the signer's own."""
    dev_key_dir: str | None = None
    """Where the development key is created on first use; unset: ``./.recovery/dev-key``
    when it exists (a project's), else the per-user ``$XDG_CONFIG_HOME/recovery/dev-key``
    (``~/.config/recovery/dev-key``), so a loop run from any directory finds the same."""
    allow_untrusted: bool = False
    """Accept checkpoints signed by keys outside the trust store (signature still checked)."""


@dataclass(kw_only=True)
class DrillConfig:
    """How ``recovery drill`` judges the drilled run against the uninterrupted one."""

    level: str = "bitwise"
    """``bitwise`` (CPU) or ``tolerance`` (non-deterministic kernels: ``atol``/``rtol``)."""
    atol: float = 0.0
    rtol: float = 0.0

    def __post_init__(self) -> None:
        if self.level not in ("bitwise", "tolerance"):
            raise ConfigError(f"drill.level: expected bitwise or tolerance, got {self.level!r}")
        if self.atol < 0 or self.rtol < 0:
            raise ConfigError(f"drill.atol/rtol: must be >= 0, got {self.atol}, {self.rtol}")


@dataclass(kw_only=True)
class HealthConfig:
    """The resume health monitor (:mod:`recovery.state.health`)."""

    enabled: bool = True
    """Record the history and judge each resume."""
    window: int = 20
    """Steps after a resume whose mean loss is compared with the history's trend."""
    fit: int = 30
    """Steps of history the trend line is fitted to."""
    history: int = 200
    """Steps of history each checkpoint carries (also calibrates the band)."""
    band: float = 5.0
    """Departure that warns, in units of the history's own prediction error."""
    sample: int = 4096
    """Parameter elements the update probe follows (spread over all parameters)."""

    def __post_init__(self) -> None:
        for name in ("window", "history", "sample"):
            if getattr(self, name) < 1:
                raise ConfigError(f"health.{name}: must be >= 1, got {getattr(self, name)}")
        if self.fit < 3:
            raise ConfigError(f"health.fit: a trend needs >= 3 steps, got {self.fit}")
        if self.history < self.min_history:
            raise ConfigError(
                f"health.history: must be >= fit + window + {BACKTESTS} = {self.min_history} "
                f"(the band is measured on the history), got {self.history}"
            )
        if self.band <= 0:
            raise ConfigError(f"health.band: must be positive, got {self.band}")

    @property
    def min_history(self) -> int:
        """Recorded steps a resume needs to be judged: a fit, a window and the backtests."""
        return self.fit + self.window + BACKTESTS


@dataclass(kw_only=True)
class DistConfig:
    """How a run started by ``torchrun`` parallelises (ignored in a single process)."""

    strategy: str = "ddp"
    """``ddp``: replicated model and optimizer; ``fsdp``: both sharded (FSDP2 ``fully_shard``)."""
    backend: str = "auto"
    """``auto`` (gloo: the recipes train on CPU), ``gloo`` or ``nccl`` (for CUDA tensors)."""
    timeout_s: float = 300.0
    """How long a collective waits for a missing rank before the job fails."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(
                f"dist.strategy: expected one of {', '.join(STRATEGIES)}, got {self.strategy!r}"
            )
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ConfigError(f"dist.backend: expected auto, gloo or nccl, got {self.backend!r}")
        if self.timeout_s <= 0:
            raise ConfigError(f"dist.timeout_s: must be positive, got {self.timeout_s}")


def typed(schema: type[T], node: Any, *, key: str) -> T:
    """Validate ``node`` (a config node or dict) against ``schema`` and build it.

    Args:
        schema: a dataclass type.
        node: the composed config node for it.
        key: its dotted key, for messages.

    Raises:
        ConfigError: naming the key, the bad value and the reason.
    """
    # OmegaConf comes with the [hydra] extra; the core (own loops) builds the dataclasses itself
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

    aliases: dict[str, str] = getattr(schema, "ALIASES", {})
    if node is not None and not isinstance(node, dict):
        try:  # resolve interpolations while the node still knows its parents
            node = OmegaConf.to_container(node, resolve=True)
        except OmegaConfBaseException as err:
            raise ConfigError(f"{key}: {err}") from err
    if aliases and isinstance(node, dict):
        node = {aliases.get(str(k), str(k)): v for k, v in node.items()}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node if node is not None else {})
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        cause = err.__cause__ if isinstance(err.__cause__, ConfigError) else None
        if cause is not None:
            raise cause from None
        where, hint = (f"{key}.{err.key}", "") if err.key is not None else (key, "")
        if isinstance(err, ConfigKeyError) and err.key is not None:
            names = [f.name for f in fields(schema)] + list(aliases)  # type: ignore[arg-type]
            hint = did_you_mean(str(err.key), names, prefix=key) or f"; {key} has {names}"
        raise ConfigError(f"{where}: {str(err).splitlines()[0]}{hint}") from err
    if not isinstance(obj, schema):
        raise ConfigError(
            f"{key}: expected a {schema.__name__} mapping, found {type(obj).__name__}"
        )
    return obj
