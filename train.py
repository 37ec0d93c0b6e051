"""``python train.py [overrides]``: train the configured recipe, or resume it.

``+resume=latest|<step>|<path>`` continues a run exactly; see README.md. Under
``torchrun`` each rank runs this same script.

Torch is imported only once the start cannot be refused from the config and a directory
listing alone (:func:`recipes.check_start`): such a refusal answers in a fraction of the
seconds that import takes.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import hydra
from omegaconf import DictConfig

import recipes
from recovery.cli import preflight, report
from recovery.errors import RecoveryError


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> str:
    """Train; return how the run went (Hydra keeps it per job: a sweep's summary)."""
    try:
        recipes.check_start(cfg)
    except RecoveryError as err:  # no process group joined yet, even under torchrun
        sys.exit(report(err))
    from recovery.parallel import world as distributed  # imports torch

    said = ""
    try:
        outcome = recipes.run(cfg)
        code, said = outcome.code, outcome.said
    except RecoveryError as err:
        code = report(err)
    except BaseException:
        if not distributed.launched():
            raise
        traceback.print_exc()
        code = 1
    if distributed.launched():
        distributed.exit_now(code)
    if code:
        sys.exit(code)
    return said


if __name__ == "__main__":
    try:  # a typo'd key or group option: one line and exit 12, not Hydra's page and exit 1
        # under -m each swept value is validated too (up to MAX_SWEEP_COMPOSES jobs), before
        # the first job trains
        conf = Path(__file__).resolve().parent / "conf"
        preflight("train.py", sys.argv[1:], conf, validate=recipes.validate)
    except RecoveryError as err:
        sys.exit(report(err))
    main()
