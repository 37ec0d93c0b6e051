"""A run's name: ``run.name``; under a SLURM job the job's, unless ``run.name`` was set;
under a Hydra sweep, one run per job (``<name>.sweep/<the job's overrides>``).

Every name is stable across requeues: a requeued command (``+resume=latest``) lands in
the run directory its first start made. Hydra's own output directory
(``hydra.run.dir``, with a timestamp) holds only its logs, never the run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from recovery.config import CheckpointConfig, RunConfig
from recovery.run.scheduling import slurm

log = logging.getLogger(__name__)


def hydra_overrides() -> list[str]:
    """The command-line overrides of this Hydra job (empty outside ``@hydra.main``)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


MAX_JOB_NAME = 200
"""Longest sweep job directory name, in bytes (a file name holds 255)."""


NAMES_NO_JOB = ("resume", "init_from", "checkpoint.root", "run.name")
"""Overrides that never tell two sweep jobs apart: a requeue adds ``+resume``, and the
roots are already the job's path."""


def sweep_job_name(name: str, cfg: DictConfig | None = None) -> str:
    """The run name of this job: ``run.name``, or under a Hydra sweep (``-m``)
    ``<run.name>.sweep/<the job's overrides>``, so each job of a sweep is its own run, the
    same sweep with ``+resume=latest`` resumes each job in its own, and no job lands in
    the plain run's directory (DVC's export stage depends on it).

    The job's overrides are Hydra's ``override_dirname`` for it, sorted, without
    :data:`NAMES_NO_JOB`; an override that is a secret (a secret-looking key, or a
    secret of ``cfg`` in its value), a path, or a key the config lists in
    ``hydra.job.config.override_dirname.exclude_keys`` is left out of the words and
    kept in a digest at the end (``~<12 hex>``), so two jobs that differ only there
    still get two runs; a name past :data:`MAX_JOB_NAME` bytes keeps its start and a
    digest of the whole."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from recovery.provenance.capture import is_secret_key, mask, secret_values

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return name
    hc = HydraConfig.get()
    exclude = set(hc.job.config.override_dirname.exclude_keys or [])
    container = OmegaConf.to_container(cfg, resolve=True) if cfg is not None else {}
    secrets = secret_values(container)
    shown, hidden = [], []
    for item in sorted(i.lstrip("+~") for i in hc.overrides.task):
        key, _, value = item.partition("=")
        if key in NAMES_NO_JOB:
            continue
        private = is_secret_key(key) or mask(value, secrets) != value
        if private or key in exclude or "/" in value:
            hidden.append(item)
        else:
            shown.append(item)
    job = ",".join(shown) or ("job" if hidden else f"job{hc.job.num}")
    if hidden:
        job += "~" + hashlib.sha256("\n".join(hidden).encode()).hexdigest()[:12]
    if len(job.encode()) > MAX_JOB_NAME:  # a file name has 255 bytes at most
        job = (
            f"{job.encode()[: MAX_JOB_NAME - 13].decode(errors='ignore')}~"
            + (hashlib.sha256(job.encode()).hexdigest()[:12])
        )
    return f"{name}.sweep/{job}"


def _job_name(run_cfg: RunConfig, ck: CheckpointConfig) -> tuple[slurm.Job | None, str, bool]:
    """The SLURM job (if any), the run's name as :func:`named` decides it, and whether
    ``run.name`` was set explicitly; nothing logged or written back."""
    job = slurm.detect(os.environ, ck.cluster.scheduler)
    if job is None:
        return None, run_cfg.name, True
    given = any(o.lstrip("+~").startswith("run.name=") for o in hydra_overrides())
    explicit = given or run_cfg.name != RunConfig().name
    return job, slurm.run_name(run_cfg.name, job, explicit=explicit), explicit


def run_dir(cfg: DictConfig, run_cfg: RunConfig, ck: CheckpointConfig) -> Path:
    """The run directory this start will use, ``<checkpoint.root>/<name>`` as :func:`named`
    and :func:`sweep_job_name` name it, with nothing logged or written back: what a check
    before the run starts may look at.

    Raises:
        ConfigError: ``checkpoint.cluster.scheduler=slurm`` outside a SLURM job.
    """
    _, name, _ = _job_name(run_cfg, ck)
    return Path(ck.root) / sweep_job_name(name, cfg)


def named(cfg: DictConfig, run_cfg: RunConfig, ck: CheckpointConfig) -> RunConfig:
    """The run's name: under a SLURM job whose command line and config leave ``run.name``
    at its default, the job's (``slurm-<job id>``, ``slurm-<array job id>-<task id>``:
    stable across requeues, :mod:`recovery.run.scheduling.slurm`), written back to ``cfg`` so the
    recorded config and the Hydra log cleanup name it too; else ``run.name``."""
    job, name, explicit = _job_name(run_cfg, ck)
    if job is None:
        return run_cfg
    if explicit:
        log.info("%s: run.name=%s as set (not the job's %s)", job.describe, name, job.run_name)
        return run_cfg
    log.info("%s: run named %s after the job (run.name= names it otherwise)", job.describe, name)
    with open_dict(cfg):
        cfg.run.name = name
    return dataclasses.replace(run_cfg, name=name)
