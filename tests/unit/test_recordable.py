"""recovery.provenance.recordable: an own loop's config as config.yaml records it."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from recovery import CheckpointConfig, Checkpointer, ConfigError, TrainState
from recovery.provenance.recordable import recordable


@dataclasses.dataclass
class Opts:
    lr: float = 0.1
    out: Path = Path("runs")


@pytest.mark.parametrize(
    ("config", "recorded"),
    [
        ({"lr": 0.1, "dirs": (Path("a"), "b")}, {"lr": 0.1, "dirs": ["a", "b"]}),
        (argparse.Namespace(lr=0.1, run_dir=Path("/r")), {"lr": 0.1, "run_dir": "/r"}),
        (Opts(), {"lr": 0.1, "out": "runs"}),
        ({"nested": {"k": [1, None, True]}}, {"nested": {"k": [1, None, True]}}),
        ({1: "x"}, {"1": "x"}),
    ],
)
def test_what_own_loops_pass_is_recorded_as_plain_values(config, recorded):
    assert recordable(config) == recorded


def test_a_value_that_cannot_be_recorded_is_named_by_its_key():
    with pytest.raises(ConfigError, match=r"model.device is a device"):
        recordable({"model": {"device": torch.device("cpu")}})
    with pytest.raises(ConfigError, match="expected a dict or an argparse Namespace"):
        recordable(3)


def test_without_a_config_the_command_line_is_recorded_and_a_change_is_drift(
    tmp_path, monkeypatch, caplog
):
    def once(argv: list[str], steps: int) -> None:
        monkeypatch.setattr(sys, "argv", ["train.py", *argv])
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        absent = {"scheduler": "constant", "sampler": "none"}
        state = TrainState(model=model, optimizer=opt, absent=absent)
        with Checkpointer(CheckpointConfig(every_steps=2), str(tmp_path / "run"),
                          final_step=steps) as ck:  # fmt: skip
            step = ck.restore(state, "latest")
            for s in range(step + 1, steps + 1):
                ck.maybe_save(state, s)
        assert ck.config == {"argv": argv}

    once(["--lr", "0.1"], 2)
    once(["--lr", "0.2"], 4)
    assert "DRIFT since step-00000002" in caplog.text and "--lr" in caplog.text
