"""``python -m recipes.prepare``: generate the interaction log (the DVC ``prepare`` stage)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipes.data import DataConfig, generate
from recovery.config import typed

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def main(argv: list[str]) -> int:
    """Compose the config with ``argv`` as overrides and generate the recipe's data."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=argv)
    data = typed(
        DataConfig, OmegaConf.to_container(cfg.recipe.data, resolve=True), key="recipe.data"
    )
    generate(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
