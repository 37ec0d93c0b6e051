"""``python -m recipes.experiment [PARAMS [METRICS]]``: the DVC ``train`` stage of a DVC experiment.

``dvc exp run -S key=value`` composes ``conf/`` with the overrides into
``params.yaml`` (DVC's Hydra composition, enabled in ``.dvc/config``) and then
runs the stage, which runs this. It trains the recipe with that composed
config, as ``python train.py`` would with the same overrides, except:

- the run is named after the experiment (``DVC_EXP_NAME``, which DVC sets
  for every experiment; ``run.name`` outside one), so two experiments never
  share a run directory;
- the run directory is ``<checkpoint.root>/exp/<name>``, a relative root
  taken from the repository DVC was started in (``DVC_ROOT``), not from the
  temporary copy a ``--temp`` or ``--queue`` experiment runs in: the
  checkpoints outlive that copy, and a requeued experiment finds them (so do
  the signing key paths, :data:`ANCHORED`);
- it always resumes (``+resume=latest``): the first run of an experiment starts
  fresh, a rerun of it (``dvc exp run -f -n NAME``, or the same queued
  command after a kill) continues the newest checkpoint that verifies,
  exactly.

At the end it writes ``METRICS`` (default ``metrics.json``): the run's
last step, loss, learning rate and epoch, and how many times the run was
resumed, from its journal, for ``dvc exp show``. Nothing is written there
when the run fails.

Exit status: the run's (0, or the code of the :class:`RecoveryError` that
stopped it, printed as one line).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

import recipes
from recovery.cli import report
from recovery.errors import ConfigError, RecoveryError
from recovery.format.layout import METRICS_FILE
from recovery.run import journal

NAME_ENV = "DVC_EXP_NAME"
"""Set by ``dvc exp run`` for the experiment's stages: the experiment's name."""
ROOT_ENV = "DVC_ROOT"
"""Set by ``dvc exp run``: the repository it was started in (not a temp copy's)."""
ANCHORED = ("checkpoint.root", "signing.key", "signing.trusted", "signing.dev_key_dir")
"""Paths that, relative, are taken from ``DVC_ROOT``: a temp copy's would vanish with it
(the checkpoints, and the dev key that signed them)."""
SUBDIR = "exp"
"""Experiments' runs live in ``<checkpoint.root>/exp/``, apart from runs started by hand."""


def configure(params: Path, env: dict[str, str]) -> DictConfig:
    """The composed config in ``params`` with the experiment's run name, run root and
    ``resume=latest`` set (see the module's docstring).

    Raises:
        ConfigError: ``params`` cannot be read, is no YAML, or is not a composed config
            (no ``checkpoint.root``).
    """
    try:
        cfg = OmegaConf.load(params)
    except (OSError, yaml.YAMLError) as err:
        reason = err.strerror if isinstance(err, OSError) else str(err).splitlines()[0]
        raise ConfigError(
            f"{params}: cannot read the composed config ({reason or err}); run "
            "`dvc exp run` with hydra.enabled (see README.md, DVC experiments)"
        ) from None
    if not isinstance(cfg, DictConfig) or OmegaConf.select(cfg, "checkpoint.root") is None:
        raise ConfigError(f"{params}: not a composed config of conf/ (no checkpoint.root)")
    name = env.get(NAME_ENV) or str(OmegaConf.select(cfg, "run.name", default="default"))
    base = Path(env.get(ROOT_ENV) or Path.cwd())
    # in the workspace itself relative paths stay relative (what the user wrote is what
    # the messages show); only a temp copy's would vanish with it
    anchor = base.resolve() != Path.cwd().resolve()
    with open_dict(cfg):
        for key in ANCHORED:
            value = OmegaConf.select(cfg, key, default=None)
            if anchor and value is not None and not Path(str(value)).is_absolute():
                OmegaConf.update(cfg, key, str(base / str(value)))
        cfg.checkpoint.root = str(Path(str(cfg.checkpoint.root)) / SUBDIR)
        cfg.run.name = name
        cfg.resume = "latest"
    OmegaConf.set_struct(cfg, True)
    return cfg


def summary(run_dir: Path) -> dict[str, Any]:
    """The run's last step record (step, loss, lr, epoch) and its number of resumes, from
    its journal; ``{}`` when it holds no step."""
    path = run_dir / METRICS_FILE
    records = list(journal.read(path)) if path.exists() else []
    steps = [r for r in records if "step" in r and "event" not in r]
    if not steps:
        return {}
    last = max(steps, key=lambda r: int(r["step"]))
    out: dict[str, Any] = {k: last[k] for k in ("step", "loss", "lr", "epoch") if k in last}
    out["resumes"] = sum(1 for r in records if r.get("event") == "resume")
    return out


def main(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Train (or resume) the experiment; write its metrics; return the exit status."""
    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    )
    env = dict(os.environ if env is None else env)
    params = Path(argv[0] if argv else "params.yaml")
    metrics = Path(argv[1] if len(argv) > 1 else "metrics.json")
    try:
        cfg = configure(params, env)
        metrics.unlink(missing_ok=True)  # a failed run leaves no metrics of an earlier one
        code = recipes.run(cfg).code
    except RecoveryError as err:
        return report(err)
    if code == 0:
        run_dir = Path(str(cfg.checkpoint.root)) / str(cfg.run.name)
        metrics.parent.mkdir(parents=True, exist_ok=True)
        metrics.write_text(json.dumps(summary(run_dir), indent=2, sort_keys=True) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
