"""The small groups: ``run``, ``train``, ``signing``, ``drill``, ``health``, ``dist``."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from recovery.config.checks import at_least, not_empty, one_of, positive, refuse
from recovery.errors import ConfigError

BACKTESTS = 10
"""Past windows, at least, that measure the resume health band."""
STRATEGIES = ("ddp", "fsdp")
"""How a ``torchrun`` job parallelises: replicated (DDP) or sharded (FSDP2)."""

THREADS_AUTO = "auto"
"""``train.threads=auto``: the count :func:`intra_op_threads` picks."""
OMP_ENV = "OMP_NUM_THREADS"
"""The environment variable that sets torch's (OpenMP's) thread count."""
PARAMS_PER_THREAD = 2**24
"""Parameters per intra-op thread under ``train.threads=auto`` (16.8M: a second thread
from 33.5M parameters on).

Every parallel op forks and joins torch's intra-op pool, and an op parallelises only
above 32768 elements per thread (torch's grain size). A step of these recipes is a few
dozen small ops over the rows a batch touches and, in the optimizer, a few passes over
every parameter: the parameter count is a step's work. A second thread pays only when
that work dwarfs the joins. On the project's 2 cores a dense embedding model's Adam
step took 2.1x as long on 2 threads as on 1 at the default recipe's 0.1M parameters,
1.5x at 2M, and was faster on 2 only from some 40M on (noisy: 0.6-0.9x at 77M). On a
busy machine each join waits for a descheduled thread, every op: there the default
recipe's training took 1.4x to 2.25x as long on 2 threads as on 1 (BENCHMARKS.md; a
user's 1200 steps: 68 s against 2.6 s). Hence one thread unless the model is large."""

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
    threads: str = THREADS_AUTO
    """Torch's intra-op (and inter-op) thread count: an integer from 1, or ``auto``:
    ``OMP_NUM_THREADS`` when the environment sets it, else one thread per
    :data:`PARAMS_PER_THREAD` parameters of the model, at least 1 and at most the cores
    this process may run on (:func:`intra_op_threads`)."""

    def __post_init__(self) -> None:
        positive("train.steps", self.steps, 1200)
        positive("train.log_every", self.log_every, 100)
        check_threads(self.threads)


def check_threads(value: object, key: str = "train.threads") -> int | None:
    """``value`` of ``train.threads`` as a thread count: ``None`` for ``auto``, else an
    integer from 1 (the schema's string ``"4"`` as ``4``).

    Raises:
        ConfigError: anything else (0, a negative or fractional number, another word).
    """
    text = str(value).strip()
    if text == THREADS_AUTO:
        return None
    if not isinstance(value, bool) and text.isascii() and text.isdigit() and int(text) >= 1:
        return int(text)
    raise refuse(key, f"expected {THREADS_AUTO} or an integer from 1, got {value!r}", THREADS_AUTO)


def intra_op_threads(setting: object, omp: str | None, cpus: int, params: int) -> int | None:
    """How many threads torch computes with, for ``train.threads=setting``.

    Args:
        setting: the value of ``train.threads`` (``auto`` or an integer from 1).
        omp: ``OMP_NUM_THREADS`` of the environment (``None``: unset).
        cpus: the cores this process may run on (:func:`available_cpus`).
        params: the model's parameter count.

    Returns:
        An integer set on the command line or in the config, as it is: it names this run's
        count. ``None`` under ``auto`` when ``omp`` is set (not blank): the user chose, and
        torch already read it; leave torch's count alone. Else one thread per
        :data:`PARAMS_PER_THREAD` parameters, from 1 to ``cpus``.

    Raises:
        ConfigError: ``setting`` is neither ``auto`` nor an integer from 1.
    """
    count = check_threads(setting)
    if count is not None:
        return count
    if omp is not None and omp.strip():
        return None
    return max(1, min(cpus, params // PARAMS_PER_THREAD))


def available_cpus() -> int:
    """The cores this process may run on: its CPU affinity (a container's or ``taskset``'s
    set), else every core of the machine."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


@dataclass(kw_only=True)
class SigningConfig:
    """Which key signs, and which public keys are trusted."""

    key: str | None = None
    """PEM private key that signs; env ``RECOVERY_SIGNING_KEY`` overrides; unset = the dev key."""
    trusted: str = ".recovery/trusted"
    """Directory of trusted public keys (``*.pub``/``*.pem``), besides the signer's own; a
    relative path is the project's (see :mod:`recovery.integrity.keys.trust`)."""
    dev_key_dir: str | None = None
    """Where the development key is (and is created on first use); unset: the search order
    of :mod:`recovery.integrity.keys.devkeys` (``$RECOVERY_DEV_KEY_DIR``, the nearest
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
