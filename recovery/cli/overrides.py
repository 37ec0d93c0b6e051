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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from recovery import errors
from recovery.config import did_you_mean


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
            f"{command}: needs Hydra ({err}); pip install -e '.[hydra]' from the checkout"
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


MAX_SWEEP_COMPOSES = 32
"""Most compositions the preflight makes of a sweep (one per value of each swept key, the
other keys at their first value); a larger sweep is checked that far, the rest by Hydra."""


def preflight(
    script: str,
    argv: Sequence[str],
    conf: Path,
    *,
    validate: Callable[[Any], None] | None = None,
) -> None:
    """Check a ``@hydra.main`` script's arguments (``argv``, without the script) before
    Hydra sees them, reading them as Hydra does: its own argument parser (``-m``,
    ``--cfg job``, ``-c``, ``-p``, ``--info``, ``--resolve``...) and its own override
    parser (sweeps: ``a=1,2``, ``choice()``, ``range()``, ``glob()``...).

    The overrides are composed with Hydra's compose API; a sweep is composed once per
    value of each swept key (the others at their first value), up to
    :data:`MAX_SWEEP_COMPOSES`, so a typo in any value is one line before any job runs.
    ``hydra.*`` overrides and a sweep Hydra alone can expand (``glob`` over a group)
    are left to Hydra; a command line that picks another config (``--config-name``…),
    or asks for help or a version, is not checked at all.

    Under ``-m``, ``validate`` (the script's own check of every value, e.g.
    :func:`recipes.validate`) runs on each composed job's config, without ``hydra``, so
    ``-m seed=0,abc`` is refused before job 0 trains; a single run validates as it starts.

    It also checks that the directory Hydra will create for the job's log
    (``hydra.run.dir``, ``hydra.sweep.dir`` under ``-m``) can be created, so a read-only
    checkpoint root is one line too, not Hydra's traceback.

    Raises:
        ConfigError: as :func:`compose`, or an override Hydra cannot parse.
        StorageError: the job's directory cannot be created.
    """
    from hydra._internal.utils import get_args_parser

    args, _ = get_args_parser().parse_known_args(list(argv))
    if args.config_name or args.config_path or args.config_dir or args.help or args.hydra_help:
        return
    if args.shell_completion or args.experimental_rerun:
        return
    modes = [flag for flag, on in (("--run", args.run), ("-m", args.multirun),
             ("--cfg", args.cfg), ("--info", args.info)) if on]  # fmt: skip
    if len(modes) > 1:
        raise errors.ConfigError(
            f"{script}: {' and '.join(modes)} cannot be combined: Hydra runs one of them "
            "(to see a sweep job's config, run that job alone with --cfg job)"
        )
    jobs = _job_overrides(script, list(args.overrides))
    multirun = args.multirun or "hydra.mode=MULTIRUN" in args.overrides
    cfg = None
    from omegaconf import OmegaConf

    for overrides in jobs:
        cfg = compose(script, overrides, conf=conf, hydra=True)
        if multirun and validate is not None:
            try:
                validate(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
            except errors.ConfigError as err:
                swept = " ".join(o for o in overrides if o not in args.overrides)
                raise errors.ConfigError(
                    f"{script} -m: the job {swept or ' '.join(overrides)}: {err}"
                ) from None

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    inspecting = args.cfg or args.info  # Hydra prints and writes nothing
    job_dir = OmegaConf.select(cfg, key, default=None) if cfg and not inspecting else None
    if job_dir is not None:
        writable(Path(str(job_dir)))


def _job_overrides(script: str, overrides: list[str]) -> list[list[str]]:
    """The override lists to compose: each swept value once (the other keys at their first
    value), the ``hydra.*`` overrides kept only where they place the job's directory."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException, OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as err:
        first = str(err.message).splitlines()[0] if err.message else str(err)
        raise errors.ConfigError(
            f"{script}: {err.override}: not an override ({first}); write key=value, e.g. "
            "train.steps=100, or a sweep key=1,2 with -m"
        ) from None
    fixed: list[str] = []
    sweeps: list[list[str]] = []
    for override, text in zip(parsed, overrides, strict=True):
        key = override.get_key_element().lstrip("+~")
        if key.startswith("hydra.") and not key.startswith(("hydra.run.dir", "hydra.sweep.")):
            continue  # Hydra's own settings: Hydra checks them
        if not override.is_sweep_override():
            fixed.append(text)
            continue
        try:
            values = [f"{override.get_key_element()}={v}" for v in override.sweep_string_iterator()]
        except HydraException:
            continue  # a glob over a group's options: only Hydra's loader can expand it
        sweeps.append(values[:MAX_SWEEP_COMPOSES])
    jobs = [fixed + [values[0] for values in sweeps]]
    for i, values in enumerate(sweeps):
        for value in values[1:]:
            if len(jobs) >= MAX_SWEEP_COMPOSES:
                return jobs
            jobs.append(fixed + [v[0] if j != i else value for j, v in enumerate(sweeps)])
    return jobs


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
