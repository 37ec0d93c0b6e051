"""The trackers' typed config (``trackers.*``), validated once at start-up.

Kept beside the trackers rather than in :mod:`recovery.config`: the schemas of the
core's groups live there, and these concern two optional extras only. Both are off
by default: nothing is imported, written or sent unless a tracker is enabled.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field

from recovery.config import parse_duration, refuse
from recovery.errors import ConfigError

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"


def _needs(module: str, extra: str, key: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"{key}: needs the {extra} extra, which is not installed; install it with "
            f"pip install -e '.[{extra}]' from the checkout, or set {key}.enabled=false"
        )


@dataclass(kw_only=True)
class TensorBoardConfig:
    """TensorBoard event files of the run."""

    enabled: bool = False
    """Write event files (loss, lr, checkpoint costs, resumes, self-check verdicts)."""
    log_dir: str | None = None
    """Where; unset: ``runs/<run name>`` (relative to the working directory). Never
    inside the run directory, which holds only the run."""

    def __post_init__(self) -> None:
        if self.log_dir is not None and not str(self.log_dir).strip():
            raise refuse(
                "trackers.tensorboard.log_dir",
                "expected a directory or null (runs/<run name>), got an empty string",
                "runs/mine",
            )
        if self.enabled:
            _needs("tensorboard", "tensorboard", "trackers.tensorboard")


@dataclass(kw_only=True)
class MlflowConfig:
    """An MLflow tracking server's run of the run (one across its resumes)."""

    enabled: bool = False
    """Log to MLflow: metrics per step, resumes, checkpoints with lineage, exports."""
    tracking_uri: str | None = None
    """The tracking server (``http://host:5000``) or store; unset: ``$MLFLOW_TRACKING_URI``."""
    experiment: str = "recovery"
    """The experiment the run is logged under (created when missing)."""
    registered_model: str | None = None
    """The registered model an export becomes a version of; unset: the run name."""
    close_timeout: str = "60s"
    """How long the end of a run waits for what is still being sent."""

    def __post_init__(self) -> None:
        try:
            parse_duration(self.close_timeout)
        except ValueError as err:
            raise refuse("trackers.mlflow.close_timeout", str(err), "60s") from None
        if not self.enabled:
            return
        _needs("mlflow", "mlflow", "trackers.mlflow")
        if not (self.tracking_uri or os.environ.get(TRACKING_URI_ENV)):
            raise ConfigError(
                f"trackers.mlflow.tracking_uri: unset, and so is ${TRACKING_URI_ENV}; name the "
                "tracking server (trackers.mlflow.tracking_uri=http://127.0.0.1:5000)"
            )
        if not self.experiment:
            raise refuse(
                "trackers.mlflow.experiment", "expected a name, got an empty string", "recovery"
            )

    @property
    def uri(self) -> str:
        """The tracking URI this config names (the setting, else the environment's)."""
        return self.tracking_uri or os.environ.get(TRACKING_URI_ENV, "")


@dataclass(kw_only=True)
class TrackersConfig:
    """Which trackers follow the run's journal (``trackers.*``; all off by default)."""

    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)

    @property
    def any(self) -> bool:
        """Whether any tracker is enabled."""
        return self.tensorboard.enabled or self.mlflow.enabled
