"""Composing the project's config from command-line overrides, and explaining a refusal.

Hydra refuses a typo'd key or an unknown group option with a multi-line
message and (under ``@hydra.main``) exit 1. Every entry point that composes
(``train.py``, ``recovery export``, ``recovery drill``) goes through
:func:`compose` instead, which turns each refusal into one
:class:`~recovery.errors.ConfigError` line (exit 12) naming the override and,
from the composed config itself, the key or option that was probably meant.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recovery import errors
from recovery.config import did_you_mean

# Hydra's own options that take a value, and overrides of Hydra's settings: the
# preflight leaves those to Hydra (they select another config or configure Hydra)
_HYDRA_OPTIONS = ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd")


def compose(
    command: str, overrides: Sequence[str], *, conf: Path | None = None, hydra: bool = False
) -> Any:
    """The project's config (``conf``, default ``./conf``) with ``overrides``, composed with
    Hydra's compose API.

    Raises:
        ConfigError: Hydra is not installed (the ``[hydra]`` extra), there is no
            ``conf/``, or an override names no key or group option of the config
            (with the likely intended one).
    """
    try:
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir
        from hydra.errors import HydraException
    except ImportError as err:
        raise errors.ConfigError(
            f"{command}: needs Hydra ({err}); pip install 'recovery[hydra]'"
        ) from None
    conf = conf if conf is not None else Path.cwd() / "conf"
    if not conf.is_dir():
        raise errors.ConfigError(
            f"{command}: no conf/ in {conf.parent}; run it from the project root "
            "(where conf/ and train.py are)"
        )
    with initialize_config_dir(config_dir=str(conf.resolve()), version_base=None):
        try:
            return hydra_compose(
                config_name="config", overrides=list(overrides), return_hydra_config=hydra
            )
        except HydraException as err:
            raise explain(err, list(overrides), conf, hydra_compose) from None


def preflight(script: str, argv: Sequence[str], conf: Path) -> None:
    """Check a ``@hydra.main`` script's arguments (``argv``, without the script) before
    Hydra sees them.

    Only plain overrides are composed; Hydra's own flags and ``hydra.*``
    overrides are left to Hydra, and a command line that picks another config
    (``--config-name``…) is not checked at all.

    It also checks that the directory Hydra will create for the job's log
    (``hydra.run.dir``) can be created, so a read-only checkpoint root is one
    line too, not Hydra's traceback.

    Raises:
        ConfigError: as :func:`compose`.
        StorageError: the job's directory cannot be created.
    """
    if any(a.split("=", 1)[0] in _HYDRA_OPTIONS for a in argv):
        return
    plain = [a for a in argv if not a.startswith("-") and not a.lstrip("+~").startswith("hydra")]
    # where the job's directory goes is checked where the command line puts it
    run_dir = [a for a in argv if a.startswith("hydra.run.dir=")]
    cfg = compose(script, plain + run_dir, conf=conf, hydra=True)
    from omegaconf import OmegaConf

    job_dir = OmegaConf.select(cfg, "hydra.run.dir", default=None)
    if job_dir is not None:
        writable(Path(str(job_dir)))


def writable(directory: Path) -> None:
    """Whether ``directory`` can be created (or written, if it exists), tried for real: a
    temporary directory is made and removed in its nearest existing ancestor.

    Raises:
        StorageError: naming the directory that refused, and why.
    """
    ancestor = directory.absolute()
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    try:
        Path(tempfile.mkdtemp(prefix=".recovery-probe-", dir=ancestor)).rmdir()
    except OSError as err:
        raise errors.StorageError(
            f"{ancestor}: cannot create {directory} there ({err.strerror or err}); the "
            "checkpoint root and run directory must be writable: fix the permissions or "
            "choose another checkpoint.root=",
            path=ancestor,
        ) from None


def explain(err: Exception, overrides: list[str], conf: Path, hydra_compose: Any) -> Exception:
    """One :class:`~recovery.errors.ConfigError` line for Hydra's refusal ``err``."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(err, MissingConfigException):
        group, _, option = str(err.missing_cfg_file or "").rpartition("/")
        options = sorted(err.options or [])
        hint = did_you_mean(option, options) if options else ""
        return errors.ConfigError(
            f"{group or 'config'}={option}: no such option in {conf / group}/; "
            f"expected one of {', '.join(options) or '(none)'}{hint}"
        )
    if isinstance(err, OverrideParseException):
        first = str(err.message).splitlines()[0] if err.message else str(err)
        return errors.ConfigError(
            f"{err.override}: not an override ({first}); write key=value, e.g. train.steps=100"
        )
    text = str(err)
    bad = next((o for o in overrides if _key(o) and f"'{_key(o)}'" in text), None)
    if bad is None:
        return errors.ConfigError(f"{' '.join(overrides)}: {text.splitlines()[0]}")
    key = _key(bad)
    groups = [o for o in overrides if "." not in o.split("=", 1)[0] and "=" in o]
    try:
        base = hydra_compose(config_name="config", overrides=groups)
    except Exception:  # the group choices failed too: no schema to suggest from
        base = None
    hint = _nearest(key, base) if base is not None else ""
    if text.startswith("Could not override"):
        return errors.ConfigError(
            f"{bad}: the config has no key {key}{hint} (a new key is added with +{bad})"
        )
    return errors.ConfigError(f"{bad}: {text.splitlines()[0].rstrip('.')}{hint}")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _nearest(key: str, cfg: Any) -> str:
    """``; did you mean `checkpoint.every_steps`?`` from the keys of ``cfg`` along ``key``."""
    parts = key.split(".")
    node = cfg
    for i, part in enumerate(parts):
        keys = [str(k) for k in node] if hasattr(node, "keys") else []
        if part in keys:
            node = node[part]
            continue
        hint = did_you_mean(part, keys, prefix=".".join(parts[:i]))
        if hint and parts[i + 1 :]:  # the rest of the key, after the corrected part
            hint = hint.replace("`?", "." + ".".join(parts[i + 1 :]) + "`?")
        return hint or f"; {'.'.join(parts[:i]) or 'the config'} has {', '.join(sorted(keys))}"
    return ""
