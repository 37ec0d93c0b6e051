"""``python train.py [overrides]``: train the configured recipe, or resume it.

``+resume=latest|<step>|<path>`` continues a run exactly; see README.md. Under
``torchrun`` each rank runs this same script.
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
from recovery.parallel import world as distributed


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        code = recipes.run(cfg)
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


if __name__ == "__main__":
    try:  # a typo'd key or group option: one line and exit 12, not Hydra's page and exit 1
        preflight("train.py", sys.argv[1:], Path(__file__).resolve().parent / "conf")
    except RecoveryError as err:
        sys.exit(report(err))
    main()
