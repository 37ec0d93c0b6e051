"""Training recipes: model + data + loop, each built from ``recovery`` parts.

``run(cfg)`` dispatches on ``cfg.recipe.name``; ``train.py`` only calls it.
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig

from recovery.errors import ConfigError


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


def run(cfg: DictConfig) -> int:
    """Run the recipe named by ``cfg.recipe.name``; return the process exit code."""
    name = str(cfg.recipe.name)
    if name not in RECIPES:
        raise ConfigError(f"recipe={name}: unknown recipe; choose one of {sorted(RECIPES)}")
    return RECIPES[name](cfg)
