"""The small groups: ``run``, ``train``, ``signing``, ``drill``, ``health``, ``dist``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from recovery.config.checks import at_least, not_empty, one_of, positive, refuse
from recovery.errors import ConfigError

BACKTESTS = 10
"""Past windows, at least, that measure the resume health band."""
STRATEGIES = ("ddp", "fsdp")
"""How a ``torchrun`` job parallelises: replicated (DDP) or sharded (FSDP2)."""

_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(kw_only=True)
class RunConfig:
    """Identity of the run."""

    name: str = "default"
    """Run name; the run directory is ``<checkpoint.root>/<name>``."""

    def __post_init__(self) -> None:
        if not _RUN_NAME.match(str(self.name)) or ".." in str(self.name):
            raise refuse(
                "run.name",
                f"{self.name!r} must be a plain directory name "
                "(letters, digits, '.', '_', '-'; no '/')",
                "my-run",
            )


@dataclass(kw_only=True)
class TrainConfig:
    """The length of the training loop."""

    steps: int = 1200
    """Total optimizer steps of the run (a resumed run continues up to this)."""
    log_every: int = 100
    """Log a progress line every this many steps."""

    def __post_init__(self) -> None:
        positive("train.steps", self.steps, 1200)
        positive("train.log_every", self.log_every, 100)


@dataclass(kw_only=True)
class SigningConfig:
    """Which key signs, and which public keys are trusted."""

    key: str | None = None
    """PEM private key that signs; env ``RECOVERY_SIGNING_KEY`` overrides; unset = the dev key."""
    trusted: str = ".recovery/trusted"
    """Directory of trusted public keys (``*.pub``/``*.pem``), besides the signer's own; a
    relative path is the project's (see :mod:`recovery.integrity.trust`)."""
    dev_key_dir: str | None = None
    """Where the development key is (and is created on first use); unset: the search order
    of :mod:`recovery.integrity.devkeys` (``$RECOVERY_DEV_KEY_DIR``, the nearest
    ``.recovery/dev-key`` above the run directory or the working directory, the per-user
    one), the same from any working directory."""
    allow_untrusted: bool = False
    """Accept checkpoints signed by keys outside the trust store (signature still checked)."""

    def __post_init__(self) -> None:
        not_empty("signing.key", self.key, "null")
        not_empty("signing.dev_key_dir", self.dev_key_dir, "null")
        if not str(self.trusted).strip():
            raise refuse(
                "signing.trusted",
                "must be a directory path, got an empty string",
                ".recovery/trusted",
            )


@dataclass(kw_only=True)
class DrillConfig:
    """How ``recovery drill`` judges the drilled run against the uninterrupted one."""

    level: str = "bitwise"
    """``bitwise`` (CPU) or ``tolerance`` (non-deterministic kernels: ``atol``/``rtol``)."""
    atol: float = 0.0
    rtol: float = 0.0

    def __post_init__(self) -> None:
        one_of("drill.level", self.level, ("bitwise", "tolerance"))
        if not (self.atol >= 0 and self.rtol >= 0):  # NaN too
            raise ConfigError(
                f"drill.atol/rtol: must be >= 0, got {self.atol}, {self.rtol}; set e.g. "
                "drill.atol=0 drill.rtol=0"
            )


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
        at_least("health.window", self.window, 1, 20)
        at_least("health.history", self.history, 1, 200)
        at_least("health.sample", self.sample, 1, 4096)
        at_least("health.fit", self.fit, 3, 30, " (a trend needs 3 steps)")
        if self.history < self.min_history:
            raise refuse(
                "health.history",
                f"must be >= fit + window + {BACKTESTS} = {self.min_history} "
                f"(the band is measured on the history), got {self.history}",
                max(200, self.min_history),
            )
        positive("health.band", self.band, 5.0)

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
            raise refuse(
                "dist.strategy",
                f"expected one of {', '.join(STRATEGIES)}, got {self.strategy!r}",
                STRATEGIES[0],
            )
        one_of("dist.backend", self.backend, ("auto", "gloo", "nccl"))
        positive("dist.timeout_s", self.timeout_s, 300)
