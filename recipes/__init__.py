"""Training recipes: model + data + loop, each built from ``recovery`` parts.

``run(cfg)`` dispatches on ``cfg.recipe.name``; ``train.py`` only calls it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from recovery.config import (
    CheckpointConfig,
    DistConfig,
    DrillConfig,
    HealthConfig,
    RunConfig,
    SigningConfig,
    TrainConfig,
    typed,
)
from recovery.errors import ConfigError, RecoveryError, StorageError
from recovery.run.trackers.config import TrackersConfig

LOGS_DIR = ".hydra"
"""``<checkpoint.root>/.hydra/<run.name>/...``: Hydra's job logs (``hydra.run.dir`` and
``hydra.sweep.dir`` in conf/config.yaml), beside the run directories, never inside one."""


def _embedding(cfg: DictConfig) -> int:
    from recipes import embedding

    return embedding.run(cfg)


def _classifier(cfg: DictConfig) -> int:
    from recipes import classifier

    return classifier.run(cfg)


RECIPES: dict[str, Callable[[DictConfig], int]] = {
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
    from omegaconf import OmegaConf

    from recipes.export import ExportConfig
    from recovery.config import check_seed, did_you_mean, refuse
    from recovery.provenance.purpose import PurposeSpec
    from recovery.run.resume import parse_spec

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
    typed(_recipe_schema(name), cfg.recipe, key="recipe")
    for purpose, node in (OmegaConf.select(cfg, "purposes", default=None) or {}).items():
        spec = typed(PurposeSpec, node, key=f"purposes.{purpose}")
        if spec.name != purpose:
            raise refuse(
                f"purposes.{purpose}.name",
                f"must name its own purpose {purpose!r}, got {spec.name!r}",
                purpose,
            )
    for key, schema in {**GROUPS, "export": ExportConfig}.items():
        typed(schema, OmegaConf.select(cfg, key, default=None), key=key)


def run(cfg: DictConfig) -> int:
    """Validate the config, run the recipe named by ``cfg.recipe.name``; return the exit code.

    A run that fails before it wrote anything (a bad value, an unreadable key)
    leaves nothing behind: not even the log directory Hydra made for it.
    """
    try:
        validate(cfg)
        return RECIPES[str(cfg.recipe.name)](cfg)
    except OSError as err:
        _discard_job_dir(cfg)
        if isinstance(err, RecoveryError):
            raise
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
    from omegaconf import OmegaConf

    from recipes.common import sweep_job_name

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
