"""The Hydra plugin of ``recovery``: Hydra instantiates sweepers only from the
``hydra_plugins`` namespace; the work is :func:`recovery.cli.hydra_sweeper.redacted_copy`."""

from __future__ import annotations

import logging
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from omegaconf import DictConfig

from recovery.cli.hydra_sweeper import LAUNCHER_LOGGER, MaskSecrets, redacted_copy, secrets_of


class RedactingSweeper(BasicSweeper):
    """Hydra's basic sweeper, saving ``multirun.yaml`` with every secret redacted (its own
    copy of the config, which only that save reads); the launcher keeps the real config,
    so the jobs run with the real values; the launcher's log of each job's overrides is
    masked."""

    def setup(self, *, config: DictConfig, **kwargs: Any) -> None:
        super().setup(config=config, **kwargs)
        secrets = secrets_of(config)
        self.config = redacted_copy(config, secrets)
        logging.getLogger(LAUNCHER_LOGGER).addFilter(MaskSecrets(secrets))
