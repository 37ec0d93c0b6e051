from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from recipes.embedding import EmbeddingConfig
from recovery.config import CheckpointConfig, RunConfig, TrainConfig, typed
from recovery.errors import ConfigError

CONF = str(Path(__file__).resolve().parents[2] / "conf")


def composed(*overrides):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def test_every_group_composes_and_validates():
    cfg = composed()
    typed(EmbeddingConfig, cfg.recipe, key="recipe")
    typed(CheckpointConfig, cfg.checkpoint, key="checkpoint")
    typed(RunConfig, cfg.run, key="run")
    typed(TrainConfig, cfg.train, key="train")
    assert "resume" not in cfg


@pytest.mark.parametrize("spec", ["latest", "/some/path/step-00000010", "1200"])
def test_resume_is_a_plain_value(spec):
    assert str(composed(f"+resume={spec}").resume) == spec


@pytest.mark.parametrize(
    ("schema", "node", "match"),
    [
        (CheckpointConfig, {"keep_last": 1}, "keep_last: must be >= 2"),
        (CheckpointConfig, {"every_steps": -1}, "every_steps"),
        (CheckpointConfig, {"every_stepz": 3}, "every_stepz"),
        (CheckpointConfig, {"keep_last": "many"}, "keep_last"),
        (RunConfig, {"name": "../x"}, "run.name"),
        (TrainConfig, {"steps": 0}, "train.steps"),
    ],
)
def test_bad_values_name_the_key(schema, node, match):
    with pytest.raises(ConfigError, match=match):
        typed(schema, node, key=schema.__name__)


def test_purpose_yaml_matches_the_library_contracts():
    from recovery.provenance.purpose import BUILTIN, PurposeSpec

    cfg = composed()
    for name, spec in BUILTIN.items():
        assert typed(PurposeSpec, cfg.purposes[name], key=name) == spec


def test_a_sparse_recipe_refuses_weight_decay_by_name():
    from recipes.embedding import OptimConfig

    with pytest.raises(ConfigError, match="recipe.optim.weight_decay.*SparseAdam has no weight"):
        OptimConfig(sparse=True, weight_decay=0.01)
    assert OptimConfig(sparse=True).sparse
