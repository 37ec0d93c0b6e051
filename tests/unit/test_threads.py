"""``train.threads``: the thread-count policy, its validation, and how a run applies it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from recovery.config import (
    PARAMS_PER_THREAD,
    THREADS_AUTO,
    TrainConfig,
    available_cpus,
    check_threads,
    intra_op_threads,
    typed,
)
from recovery.errors import ConfigError
from recovery.exitcodes import exit_code

CONF = str(Path(__file__).resolve().parents[2] / "conf")
P = PARAMS_PER_THREAD


def composed(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize(
    ("setting", "omp", "cpus", "params", "expected"),
    [
        # auto, no OMP_NUM_THREADS: one thread per PARAMS_PER_THREAD, from 1 to the cores
        ("auto", None, 2, 0, 1),
        ("auto", None, 2, 99_001, 1),  # the default embedding model's size
        ("auto", None, 64, 99_001, 1),  # a small model gets one thread on any machine
        ("auto", None, 8, 2 * P - 1, 1),
        ("auto", None, 8, 2 * P, 2),
        ("auto", None, 8, 3 * P, 3),
        ("auto", None, 2, 3 * P, 2),  # never more than the cores
        ("auto", None, 1, 100 * P, 1),
        # auto, OMP_NUM_THREADS set: the user chose, torch keeps what it read
        ("auto", "4", 2, 99_001, None),
        ("auto", "1", 64, 100 * P, None),
        ("auto", "", 8, 3 * P, 3),  # blank is unset
        ("auto", "  ", 8, 3 * P, 3),
        # an integer names this run's count, whatever the environment or the size
        ("3", None, 2, 0, 3),
        ("3", "1", 2, 0, 3),
        ("1", None, 64, 100 * P, 1),
        (" 2 ", None, 1, 0, 2),
        (5, None, 1, 0, 5),  # an own loop's TrainConfig(threads=5)
    ],
)
def test_the_thread_count_policy(setting, omp, cpus, params, expected):
    assert intra_op_threads(setting, omp, cpus, params) == expected


@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "abc", "", "AUTO", "²", 0, -2, 1.0, True])
def test_a_bad_threads_value_is_one_line_naming_key_expected_and_found(bad):
    with pytest.raises(ConfigError) as caught:
        intra_op_threads(bad, None, 2, 0)
    message = str(caught.value)
    assert exit_code(caught.value) == 12
    assert "\n" not in message and message.startswith("train.threads: "), message
    assert f"expected {THREADS_AUTO} or an integer from 1, got {bad!r}" in message, message
    assert message.endswith(f"; set e.g. train.threads={THREADS_AUTO}"), message
    with pytest.raises(ConfigError, match="^train.threads: "):
        TrainConfig(threads=bad)


@pytest.mark.parametrize("override", ["train.threads=0", "train.threads=two", "train.threads=-3"])
def test_the_composed_config_is_checked_at_start_up(override):
    import recipes

    with pytest.raises(ConfigError, match="^train.threads: expected auto or an integer from 1"):
        recipes.validate(composed(override))


def test_the_default_is_auto_and_an_integer_composes():
    assert typed(TrainConfig, composed().train, key="train").threads == THREADS_AUTO
    assert (
        check_threads(typed(TrainConfig, composed("train.threads=4").train, key="train").threads)
        == 4
    )


@pytest.mark.parametrize("recipe", ["embedding", "classifier"])
def test_both_recipes_get_one_thread_by_default_on_any_machine(recipe):
    import recipes

    cfg = composed(f"recipe={recipe}")
    params = recipes._parameters(cfg)
    assert 0 < params < PARAMS_PER_THREAD
    for cpus in (1, 2, available_cpus(), 256):
        assert intra_op_threads(THREADS_AUTO, None, cpus, params) == 1


def test_the_parameter_count_is_the_built_models_and_draws_no_random_number():
    import torch

    import recipes
    from recipes.embedding import DotProduct

    cfg = composed("recipe.model.dim=48")
    before = torch.get_rng_state()
    counted = recipes._parameters(cfg)
    assert torch.equal(before, torch.get_rng_state())
    data = cfg.recipe.data
    built = DotProduct(data.num_users, data.num_items, 48, 0.1)
    assert counted == sum(p.numel() for p in built.parameters())


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, n: int) -> None:
        self.calls.append(n)


@pytest.fixture
def recorded(monkeypatch):
    """torch's two setters, recorded instead of called: the test process keeps its count."""
    import torch

    intra, inter = _Recorder(), _Recorder()
    monkeypatch.setattr(torch, "set_num_threads", intra)
    monkeypatch.setattr(torch, "set_num_interop_threads", inter)
    return intra, inter


def test_a_run_sets_both_counts_before_the_recipe_and_leaves_omp_alone(monkeypatch, recorded):
    import recipes

    intra, inter = recorded
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert recipes.set_threads(composed()) == 1
    assert intra.calls == [1] and inter.calls == [1]
    assert recipes.set_threads(composed("train.threads=3")) == 3
    assert intra.calls[-1] == 3 and inter.calls[-1] == 3

    intra.calls.clear()
    inter.calls.clear()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    recipes.set_threads(composed())
    assert intra.calls == [] and inter.calls == []  # the environment's count stands
    assert recipes.set_threads(composed("train.threads=1")) == 1  # an integer wins
    assert intra.calls == [1] and inter.calls == [1]


def test_a_second_run_in_one_process_keeps_the_first_inter_op_count(monkeypatch, recorded):
    import torch

    import recipes

    def refused(n: int) -> None:
        raise RuntimeError("Error: cannot set number of interop threads after parallel work")

    monkeypatch.setattr(torch, "set_num_interop_threads", refused)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert recipes.set_threads(composed("train.threads=2")) == 2
    assert recorded[0].calls == [2]
