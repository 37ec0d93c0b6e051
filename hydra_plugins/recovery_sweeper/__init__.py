"""The Hydra plugin of ``recovery``: Hydra instantiates sweepers only from the
``hydra_plugins`` namespace; the work is :func:`recovery.cli.hydra_sweeper.redacted_copy`."""

from __future__ import annotations

import logging
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from omegaconf import DictConfig

from recovery.cli.hydra_sweeper import (
    LAUNCHER_LOGGER,
    MaskSecrets,
    job_line,
    redacted_copy,
    secrets_of,
)

log = logging.getLogger("recovery.sweep")


class RedactingSweeper(BasicSweeper):
    """Hydra's basic sweeper, saving ``multirun.yaml`` with every secret redacted (its own
    copy of the config, which only that save reads); the launcher keeps the real config,
    so the jobs run with the real values; the launcher's log of each job's overrides is
    masked."""

    def setup(self, *, config: DictConfig, **kwargs: Any) -> None:
        super().setup(config=config, **kwargs)
        self.secrets = secrets_of(config)
        self.config = redacted_copy(config, self.secrets)
        logging.getLogger(LAUNCHER_LOGGER).addFilter(MaskSecrets(self.secrets))

    def sweep(self, arguments: list[str]) -> Any:
        """Run the jobs as Hydra's basic sweeper does, then say in one line per job how it
        went (``new``, ``resumed from step N``, ``finished ... nothing to train``: what each
        job's ``train.py`` returned), named by the overrides that tell it apart, masked as
        the launcher's are."""
        returns = super().sweep(arguments)
        jobs = [job for batch in returns for job in batch]
        swept = [list(job.overrides or []) for job in jobs]
        shared = set.intersection(*map(set, swept)) if len(swept) > 1 else set()
        log.info("sweep: %d jobs", len(jobs))
        for number, (job, overrides) in enumerate(zip(jobs, swept, strict=True)):
            own = [o for o in overrides if o not in shared] or overrides  # what tells it apart
            log.info("%s", job_line(number, own, job.return_value, self.secrets))
        return returns
