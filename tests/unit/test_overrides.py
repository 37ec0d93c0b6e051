"""Hydra's refusals, one line each with the key or option that was probably meant."""

import re
from pathlib import Path

import pytest

from recovery import errors
from recovery.cli.overrides import compose, preflight
from recovery.config import CheckpointConfig, TrainConfig, did_you_mean, typed

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["checkpoint.evry_steps=5"], "did you mean `checkpoint.every_steps`?"),
        (["chekpoint.every_steps=5"], "did you mean `checkpoint.every_steps`?"),
        (["recipe.optim.lrr=0.1"], "did you mean `recipe.optim.lr`?"),
        (["recipe=classifier", "recipe.batch_sze=3"], "did you mean `recipe.batch_size`?"),
        (["recipe=nonexist"], "expected one of classifier, embedding"),
        (["recipe=clasifier"], "did you mean `classifier`?"),
        (["zzz.y=3"], "the config has checkpoint, dist"),
        (["train.steps"], "write key=value"),
        (["+checkpoint.every_steps=3"], "An item is already at 'checkpoint.every_steps'"),
    ],
)
def test_a_refused_override_is_one_line_naming_it(overrides, names):
    with pytest.raises(errors.ConfigError) as refused:
        compose("train.py", overrides, conf=CONF)
    text = str(refused.value)
    assert names in text and "\n" not in text, text
    assert overrides[-1].split("=")[0].lstrip("+") in text


def test_good_overrides_compose():
    cfg = compose("train.py", ["recipe=classifier", "checkpoint.every_steps=7"], conf=CONF)
    assert cfg.checkpoint.every_steps == 7 and cfg.recipe.name == "classifier"


def test_preflight_leaves_hydra_options_to_hydra():
    preflight("train.py", ["--multirun", "hydra.verbose=true", "train.steps=3"], CONF)
    preflight("train.py", ["--config-name", "other", "nonsense.key=1"], CONF)
    with pytest.raises(errors.ConfigError, match="every_steps"):
        preflight("train.py", ["-m", "checkpoint.evry_steps=1"], CONF)


def test_no_conf_directory(tmp_path):
    with pytest.raises(errors.ConfigError, match="no conf/"):
        compose("export", [], conf=tmp_path / "conf")


@pytest.mark.parametrize(
    ("word", "choices", "hint"),
    [
        ("evry_steps", ["every_steps", "keep_last"], "; did you mean `every_steps`?"),
        ("zzz", ["every_steps", "keep_last"], ""),
        ("lastest", ["latest"], "; did you mean `latest`?"),
    ],
)
def test_did_you_mean(word, choices, hint):
    assert did_you_mean(word, choices) == hint


def test_typed_names_the_key_and_the_nearest_field():
    with pytest.raises(errors.ConfigError, match=r"checkpoint\.evry_steps: .*`checkpoint\.every"):
        typed(CheckpointConfig, {"evry_steps": 1}, key="checkpoint")
    with pytest.raises(errors.ConfigError, match=r"^train\.steps: .*'abc'"):
        typed(TrainConfig, {"steps": "abc"}, key="train")


def test_preflight_checks_the_job_directory_where_the_command_line_puts_it(tmp_path):
    (tmp_path / "afile").write_text("x")
    preflight("train.py", [f"hydra.run.dir={tmp_path}/ok/job"], CONF)
    assert not (tmp_path / "ok").exists()  # the probe leaves nothing
    with pytest.raises(errors.StorageError, match="afile"):
        preflight("train.py", [f"hydra.run.dir={tmp_path}/afile/job"], CONF)


@pytest.mark.parametrize(
    "argv",
    [
        ["--cfg", "job"],
        ["-c", "hydra", "train.steps=3"],
        ["--cfg", "all", "--resolve"],
        ["-c", "job", "-p", "checkpoint"],
        ["--info"],
        ["--info", "config"],
        ["-m", "seed=0,1"],
        ["--multirun", "seed=choice(0,1,2)", "train.steps=range(1,4)"],
        ["-m", "recipe=glob(*)"],
        ["-m", "seed=0,1", "+resume=latest"],
        ["hydra.mode=MULTIRUN", "seed=0,1"],
        ["--help"],
        ["--hydra-help"],
    ],
)
def test_every_form_of_hydras_command_line_passes_the_preflight(argv):
    preflight("train.py", argv, CONF)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["-m", "seed=0,1", "checkpoint.evry_steps=3"], "did you mean `checkpoint.every_steps`"),
        (["-m", "recipe=embedding,nonexist"], "recipe=nonexist: no such option"),
        (["-m", "train.stepz=choice(5,6)"], "did you mean `train.steps`"),
        (["-m", "seed=0,1", "--cfg", "job"], "-m and --cfg cannot be combined"),
        (["seed=[0,1"], "not an override"),
    ],
)
def test_a_bad_sweep_is_one_line_before_any_job(argv, says):
    with pytest.raises(errors.ConfigError, match=re.escape(says)):
        preflight("train.py", argv, CONF)


def test_a_sweeps_every_value_is_validated_before_its_first_job():
    from recipes import validate

    with pytest.raises(errors.ConfigError, match=re.escape("train.py -m: the job seed=abc: seed")):
        preflight("train.py", ["-m", "seed=0,abc"], CONF, validate=validate)
    preflight("train.py", ["-m", "seed=0,1"], CONF, validate=validate)
    # a single run validates as it starts: the preflight composes and checks keys alone
    preflight("train.py", ["seed=abc"], CONF, validate=validate)
