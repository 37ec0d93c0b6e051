"""Training recipes: model + data + loop, each built from ``recovery`` parts.

``run(cfg)`` dispatches on ``cfg.recipe.name``; ``train.py`` calls it, after
``check_start(cfg)``: what can refuse a start before torch is imported.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recipes.outcome import Outcome
from recovery import access
from recovery.config import (
    THREADS_AUTO,
    CheckpointConfig,
    DistConfig,
    DrillConfig,
    HealthConfig,
    RunConfig,
    SigningConfig,
    TrainConfig,
    available_cpus,
    intra_op_threads,
    typed,
)
from recovery.config.groups import OMP_ENV
from recovery.errors import ConfigError, RecoveryError, RunDirInUseError, StorageError
from recovery.format.layout import refuse_reuse
from recovery.run.trackers.config import TrackersConfig

log = logging.getLogger(__name__)

LOGS_DIR = ".hydra"
"""``<checkpoint.root>/.hydra/<run.name>/...``: Hydra's job logs (``hydra.run.dir`` and
``hydra.sweep.dir`` in conf/config.yaml), beside the run directories, never inside one."""
RESUME_AFTER = "then requeue with +resume=latest (committed checkpoints are intact)"
"""What a run refused for a permission says to do once it is fixed."""


def _embedding(cfg: DictConfig) -> Outcome:
    from recipes import embedding

    return embedding.run(cfg)


def _classifier(cfg: DictConfig) -> Outcome:
    from recipes import classifier

    return classifier.run(cfg)


RECIPES: dict[str, Callable[[DictConfig], Outcome]] = {
    "embedding": _embedding,
    "classifier": _classifier,
}


GROUPS = {
    "checkpoint": CheckpointConfig,
    "run": RunConfig,
    "train": TrainConfig,
    "signing": SigningConfig,
    "health": HealthConfig,
    "dist": DistConfig,
    "drill": DrillConfig,
    "trackers": TrackersConfig,
}
"""The shared groups and their schemas (the recipe validates ``recipe``; export, ``export``)."""


ADDED_KEYS = ("resume", "init_from")
"""The keys a command line adds (``+resume=``, ``+init_from=``): an added key close to one
of them is a typo, refused before it silently starts a fresh run."""


def _recipe_schema(name: str) -> type:
    if name == "classifier":
        from recipes.classifier import ClassifierConfig

        return ClassifierConfig
    from recipes.embedding import EmbeddingConfig

    return EmbeddingConfig


def validate(cfg: DictConfig) -> None:
    """Validate every value of the composed config at start-up, so a bad value fails in one
    line (exit 12) before anything runs (``export.dtype=int8`` refused now, not after
    training at export; ``seed=-1`` here, not as numpy's traceback in the sampler).

    Checks the added keys (``+resme=latest`` is refused with the likely intended key),
    ``seed``, ``+resume``/``+init_from``, the recipe's own schema,
    ``purposes.*`` and every group of :data:`GROUPS` and ``export``.

    Raises:
        ConfigError: naming the first bad key, the value and a valid one.
    """
    from recipes.export import ExportConfig

    _validate_top(cfg)
    typed(_recipe_schema(str(cfg.recipe.name)), cfg.recipe, key="recipe")
    _validate_groups(cfg)
    typed(ExportConfig, OmegaConf.select(cfg, "export", default=None), key="export")


def _validate_top(cfg: DictConfig) -> None:
    """The added keys, ``seed``, ``+resume``/``+init_from`` and the recipe's name."""
    from recovery.config import check_seed, did_you_mean, refuse
    from recovery.run.restoring.choose import parse_spec

    for top in map(str, cfg):  # a project may add its own keys (+db.password=...)
        hint = did_you_mean(top, list(ADDED_KEYS))
        if hint and top not in ADDED_KEYS:
            raise ConfigError(
                f"+{top}: not a key of the config{hint.replace('`', '`+', 1)} (remove +{top}=)"
            )
    check_seed(OmegaConf.select(cfg, "seed", default=None))
    for key in ("resume", "init_from"):
        if key in cfg:
            parse_spec(cfg[key], f"+{key}")
    name = str(OmegaConf.select(cfg, "recipe.name", default=""))
    if name not in RECIPES:
        raise refuse(
            "recipe", f"unknown recipe {name!r}; choose one of {sorted(RECIPES)}", "embedding"
        )


def _validate_groups(cfg: DictConfig) -> None:
    """``purposes.*`` and every group of :data:`GROUPS` (none of them needs torch)."""
    from recovery.config import refuse
    from recovery.provenance.purpose import PurposeSpec

    for purpose, node in (OmegaConf.select(cfg, "purposes", default=None) or {}).items():
        spec = typed(PurposeSpec, node, key=f"purposes.{purpose}")
        if spec.name != purpose:
            raise refuse(
                f"purposes.{purpose}.name",
                f"must name its own purpose {purpose!r}, got {spec.name!r}",
                purpose,
            )
    for key, schema in GROUPS.items():
        typed(schema, OmegaConf.select(cfg, key, default=None), key=key)


def check_start(cfg: DictConfig) -> None:
    """What can refuse this start from the config and a directory listing alone, answered
    before torch is imported (which takes seconds, more on a busy machine): ``train.py``
    calls it before :func:`run`.

    Checks every value :func:`validate` checks but the recipe's and ``export``'s (their
    schemas live beside their torch code; :func:`run` checks them next), then refuses a
    fresh or warm-started run (no ``+resume=``) pointed at a run directory that already
    holds checkpoints, with the message and exit code (13) of the run's own check
    (:func:`recovery.format.layout.refuse_reuse`), which still runs after the run takes the
    directory's lock. A directory that cannot be listed is left to that check. A refused
    start leaves nothing behind that it made, as :func:`run`.

    Raises:
        ConfigError: a bad value (exit 12).
        RunDirInUseError: the run directory holds committed checkpoints (exit 13).
    """
    try:
        _validate_top(cfg)
        _validate_groups(cfg)
        if OmegaConf.select(cfg, "resume", default=None) is None:
            _refuse_reuse(cfg)
    except Exception:
        _discard_job_dir(cfg)
        raise


def _refuse_reuse(cfg: DictConfig) -> None:
    """:func:`recovery.format.layout.refuse_reuse` of the run directory this start will use
    (the run's own check, from a listing: no torch)."""
    from recipes.naming import run_dir as planned_run_dir

    ck = typed(CheckpointConfig, cfg.checkpoint, key="checkpoint")
    run_dir = planned_run_dir(cfg, typed(RunConfig, cfg.run, key="run"), ck)
    try:
        refuse_reuse(run_dir)
    except RunDirInUseError:  # an OSError too (FileExistsError)
        raise
    except OSError:  # unreadable: the run's own check says why, after it takes the lock
        return


def _parameters(cfg: DictConfig) -> int:
    """The parameter count of the recipe's model, built on the meta device: no memory, no
    kernel, no random draw (the seeded streams are untouched)."""
    import torch

    name = str(cfg.recipe.name)
    rc: Any = typed(_recipe_schema(name), cfg.recipe, key="recipe")
    with torch.device("meta"):
        if name == "classifier":
            from recipes.classifier import CNN

            model: torch.nn.Module = CNN(rc.dropout)
        else:
            from recipes.embedding import DotProduct

            model = DotProduct(
                rc.data.num_users,
                rc.data.num_items,
                rc.model.dim,
                rc.model.dropout,
                sparse=rc.optim.sparse,
            )
    return sum(p.numel() for p in model.parameters())


def set_threads(cfg: DictConfig) -> int:
    """Set torch's intra-op and inter-op thread counts as ``train.threads`` says
    (:func:`recovery.config.intra_op_threads`), before the recipe's first torch op;
    return the intra-op count torch then uses.

    Under ``auto`` with ``OMP_NUM_THREADS`` set, torch's count (which it read from that)
    is left as it is. The inter-op count can be set once per process, before any inter-op
    work: a second run in the same process keeps the first's.
    """
    import torch

    setting = typed(TrainConfig, cfg.train, key="train").threads
    cpus, params = available_cpus(), _parameters(cfg)
    count = intra_op_threads(setting, os.environ.get(OMP_ENV), cpus, params)
    if count is None:
        log.info("torch threads: %d (%s)", torch.get_num_threads(), OMP_ENV)
        return torch.get_num_threads()
    torch.set_num_threads(count)
    with contextlib.suppress(RuntimeError):  # already set, or inter-op work has started
        torch.set_num_interop_threads(count)
    why = f": {params} parameters, {cpus} cores" if setting == THREADS_AUTO else ""
    log.info("torch threads: %d (train.threads=%s%s)", count, setting, why)
    return count


def run(cfg: DictConfig) -> Outcome:
    """Validate the config, set torch's thread count (:func:`set_threads`), run the recipe
    named by ``cfg.recipe.name``; return its outcome (exit code, and how the run went).

    A run that fails before it wrote anything (a bad value, an unreadable key)
    leaves nothing behind: not even the log directory Hydra made for it.
    """
    try:
        validate(cfg)
        set_threads(cfg)
        return RECIPES[str(cfg.recipe.name)](cfg)
    except OSError as err:
        _discard_job_dir(cfg)
        if isinstance(err, RecoveryError):
            raise
        if isinstance(err, PermissionError):  # a permission, not the storage: say whose
            raise access.denied(err, "a file the run reads or writes", RESUME_AFTER) from err
        # the storage failed under the run (its directory deleted, the disk full): one line
        raise StorageError(
            f"{err.filename or 'the checkpoint root'}: {err.strerror or err}; committed "
            "checkpoints are intact. Free space or restore the directory, then requeue with "
            "+resume=latest",
            path=Path(err.filename) if isinstance(err.filename, str) else None,
        ) from err
    except Exception:
        _discard_job_dir(cfg)
        raise


def _discard_job_dir(cfg: DictConfig) -> None:
    """After a refused start: remove this Hydra job's log directory, and the directories
    above it up to ``<checkpoint.root>/.hydra`` that this leaves empty, when the run left
    nothing of its own (its run directory does not exist: a refused start removes what it
    made). A run that started keeps its log, whatever ends it (a crash, a preemption)."""
    import shutil

    from hydra.core.hydra_config import HydraConfig

    from recipes.naming import sweep_job_name

    if not HydraConfig.initialized():
        return
    root = Path(str(OmegaConf.select(cfg, "checkpoint.root", default="checkpoints")))
    name = sweep_job_name(str(OmegaConf.select(cfg, "run.name", default="default")), cfg)
    if (root / name).exists():
        return  # the run began: its log is the record of what happened
    logs = root / LOGS_DIR
    job_dir = Path(HydraConfig.get().runtime.output_dir)
    if logs.absolute() not in job_dir.absolute().parents:
        return  # a job directory the command line placed elsewhere: the user's
    logging.shutdown()  # Hydra's file handler holds the job's log open
    shutil.rmtree(job_dir, ignore_errors=True)
    for directory in job_dir.parents:
        with contextlib.suppress(OSError):  # not empty: other jobs' logs stay
            directory.rmdir()
        if directory.absolute() == logs.absolute():
            break
