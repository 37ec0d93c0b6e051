import copy
import functools
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


BAD_VALUES = [
    ("seed=-1", "seed"),
    ("seed=18446744073709551616", "seed"),
    ("seed=1.5", "seed"),
    ("seed=abc", "seed"),
    ("+resume=-1", "resume"),
    ("+resme=latest", "+resme"),
    ("train.steps=0", "train.steps"),
    ("train.steps=1.5", "train.steps"),
    ("train.log_every=0", "train.log_every"),
    ("run.name=a/b", "run.name"),
    ("checkpoint.root=''", "checkpoint.root"),
    ("checkpoint.every_steps=-1", "checkpoint.every_steps"),
    ("checkpoint.keep_last=1", "checkpoint.keep_last"),
    ("checkpoint.keep_every=-5", "checkpoint.keep_every"),
    ("checkpoint.every_seconds=-1", "checkpoint.every_seconds"),
    ("checkpoint.warm_start_every=-1", "checkpoint.warm_start_every"),
    ("checkpoint.interval=often", "checkpoint.interval"),
    ("checkpoint.mtbf=0", "checkpoint.mtbf"),
    ("checkpoint.mtbf=inf", "checkpoint.mtbf"),
    ("checkpoint.preempt_signals=[SIGKILL]", "checkpoint.preempt_signals"),
    ("checkpoint.preempt_signals=[SIGFOO]", "checkpoint.preempt_signals"),
    ("checkpoint.best_mode=up", "checkpoint.best_mode"),
    ("checkpoint.best_metric=''", "checkpoint.best_metric"),
    ("checkpoint.shard_mb=-1", "checkpoint.shard_mb"),
    ("checkpoint.hash=md5", "checkpoint.hash"),
    ("checkpoint.async=maybe", "checkpoint.async"),
    ("checkpoint.dvc.remote=''", "checkpoint.dvc.remote"),
    ("checkpoint.dvc.close_timeout=-3", "checkpoint.dvc.close_timeout"),
    ("checkpoint.differential.full_every=0", "checkpoint.differential.full_every"),
    ("checkpoint.differential.min_mb=-1", "checkpoint.differential.min_mb"),
    ("checkpoint.resume_check.rtol=nan", "checkpoint.resume_check.rtol"),
    ("health.window=0", "health.window"),
    ("health.fit=2", "health.fit"),
    ("health.history=30", "health.history"),
    ("health.band=0", "health.band"),
    ("health.sample=0", "health.sample"),
    ("dist.strategy=zero", "dist.strategy"),
    ("dist.backend=mpi", "dist.backend"),
    ("dist.timeout_s=0", "dist.timeout_s"),
    ("signing.key=''", "signing.key"),
    ("signing.trusted=''", "signing.trusted"),
    ("signing.dev_key_dir=''", "signing.dev_key_dir"),
    ("export.dtype=int8", "export.dtype"),
    ("export.source=lastest", "export.source"),
    ("export.out=''", "export.out"),
    ("drill.level=exact", "drill.level"),
    ("drill.atol=-1", "drill.atol"),
    ("trackers.mlflow.close_timeout=0", "trackers.mlflow.close_timeout"),
    ("purposes.continuation.name=inference", "purposes.continuation.name"),
    ("recipe.batch_size=0", "recipe.batch_size"),
    ("recipe.data.seed=-1", "recipe.data.seed"),
    ("recipe.data.holdout=0.5", "recipe.data.holdout"),
    ("recipe.data.noise=-1", "recipe.data.noise"),
    ("recipe.data.shards=0", "recipe.data.shards"),
    ("recipe.data.root=", "recipe.data.root"),
    ("recipe.data.root=.", "recipe.data.root"),
    ("recipe.model.dropout=1", "recipe.model.dropout"),
    ("recipe.optim.lr=nan", "recipe.optim.lr"),
    ("recipe.optim.weight_decay=-1", "recipe.optim.weight_decay"),
    ("recipe.optim.min_lr_ratio=2", "recipe.optim.min_lr_ratio"),
    ("recipe=classifier recipe.lr=0", "recipe.lr"),
    ("recipe=classifier recipe.data_seed=-1", "recipe.data_seed"),
    ("recipe=classifier recipe.val_size=1797", "recipe.val_size"),
    ("recipe=classifier recipe.num_workers=-1", "recipe.num_workers"),
    ("recipe=classifier recipe.dropout=1", "recipe.dropout"),
    ("recipe=classifier recipe.noise=-0.1", "recipe.noise"),
]


@functools.cache
def _base(recipe):
    return composed(f"recipe={recipe}")


def overridden(overrides):
    """The composed config with ``overrides`` applied as Hydra parses them (one compose per
    recipe, not per case: a compose costs half a second)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    items = overrides.split()
    recipe = next((o.split("=")[1] for o in items if o.startswith("recipe=")), "embedding")
    cfg = copy.deepcopy(_base(recipe))
    for item in OverridesParser.create().parse_overrides([o for o in items if "recipe=" not in o]):
        key = item.key_or_group
        OmegaConf.update(cfg, key, item.value(), merge=False, force_add=item.is_add())
    return cfg


@pytest.mark.parametrize(("overrides", "key"), BAD_VALUES)
def test_every_bad_value_is_one_line_naming_its_key_exit_12(overrides, key):
    import recipes
    from recovery.exitcodes import exit_code

    with pytest.raises(ConfigError) as caught:
        recipes.validate(overridden(overrides))
    message = str(caught.value)
    assert exit_code(caught.value) == 12
    assert "\n" not in message and message.startswith(key), message
    # what to do: a valid value (resume's and trackers' messages say it in their own words)
    if not key.startswith(("+", "resume", "export.source", "trackers.")):
        assert f"; set e.g. {key}" in message, message


def test_the_defaults_and_both_recipes_validate():
    import recipes

    recipes.validate(composed())
    recipes.validate(composed("recipe=classifier", "seed=18446744073709551615", "+db.password=x"))


def test_seed_range_is_what_torch_and_numpy_accept():
    import numpy as np
    import torch

    from recovery.config import SEED_MAX, check_seed

    for seed in (0, SEED_MAX):
        torch.manual_seed(check_seed(seed))
        np.random.default_rng([check_seed(seed), 0])
    with pytest.raises(ValueError):
        np.random.default_rng([-1, 0])
    with pytest.raises((ValueError, RuntimeError, OverflowError)):
        torch.manual_seed(SEED_MAX + 1)


def test_train_py_with_a_bad_seed_is_one_line_and_exit_12(tmp_path):
    import sys

    from tests import launcher

    root = Path(CONF).parent
    done = launcher.run(
        [sys.executable, str(root / "train.py"), "seed=-1", f"checkpoint.root={tmp_path}"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 12, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: seed: expected an integer from 0 to 2**64-1")
    assert not any(tmp_path.iterdir()), "a refused start leaves nothing behind"
