"""recipes.naming.named: under a SLURM job the run is named after the job unless
``run.name`` was set, on the command line (a Hydra override, ``run.name=default``
included) or in the config; outside a job, as configured. Hydra's real config store
(``compose`` with its own config), no train.py."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from recipes.naming import named
from recovery.config import CheckpointConfig, ClusterConfig, RunConfig


def composed(conf_dir, name: str, overrides: list[str]) -> DictConfig:
    """The config of a Hydra run of ``overrides``, Hydra's own state set as a run sets it."""
    (conf_dir / "config.yaml").write_text(f"run:\n  name: {name}\n")
    with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


@pytest.fixture
def hydra_run(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    yield lambda name, overrides: composed(tmp_path, name, overrides)
    HydraConfig.instance().cfg = None  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("in_config", "overrides", "expected"),
    [
        ("default", [], "slurm-41"),  # left at its default: the job's
        ("default", ["run.name=mine"], "mine"),  # the command line's
        ("default", ["run.name=default"], "default"),  # default, said on the command line
        ("theirs", [], "theirs"),  # the config's own
    ],
)
def test_an_explicit_run_name_wins_over_the_job_s(hydra_run, in_config, overrides, expected):
    cfg = hydra_run(in_config, overrides)
    run = named(cfg, RunConfig(name=cfg.run.name), CheckpointConfig())
    assert run.name == expected
    assert cfg.run.name == expected  # what the recorded config says


def test_outside_a_job_or_told_to_ignore_it_the_name_is_as_configured(hydra_run, monkeypatch):
    cfg = hydra_run("default", [])
    ignore = CheckpointConfig(cluster=ClusterConfig(scheduler="none"))
    assert named(cfg, RunConfig(), ignore).name == "default"
    monkeypatch.delenv("SLURM_JOB_ID")
    assert named(cfg, RunConfig(), CheckpointConfig()).name == "default"
