"""``recovery import`` as a user runs it: a Lightning-shaped checkpoint of the embedding
model becomes an artifact ``python train.py +init_from=`` starts from, and audits back to;
a checkpoint with a payload is refused by the real command without running it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import safetensors.torch
import torch

from recovery.format.layout import METRICS_FILE, step_dir_name
from recovery.integrity.trust import KEY_ENV
from tests import launcher
from tests.integration.conftest import STEPS

RECOVERY = str(Path(sys.executable).parent / "recovery")


def recovery(*argv: str, signer) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, KEY_ENV: str(signer.path)}
    return launcher.run(
        [RECOVERY, *argv], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_a_lightning_checkpoint_warm_starts_train_py_and_audits_back(
    tmp_path, reference, trainer, signer
):
    weights = safetensors.torch.load_file(reference / step_dir_name(STEPS) / "model.safetensors")
    ckpt = {
        "pytorch-lightning_version": "2.4.0",
        "epoch": 1,
        "global_step": 80,
        "state_dict": {f"model.{k}": v for k, v in weights.items()},
        "hyper_parameters": {"dim": 8},
    }
    torch.save(ckpt, tmp_path / "last.ckpt")
    artifact = tmp_path / "imports" / "emb"
    done = recovery(
        "import", str(tmp_path / "last.ckpt"), "--out", str(artifact), "--strip-prefix",
        "model.", signer=signer,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "origin unverified" in done.stdout

    run = trainer(tmp_path / "ck", "run.name=ft", "train.steps=10", f"+init_from={artifact}")
    assert run.returncode == 0, run.output
    events = [json.loads(line) for line in (tmp_path / "ck" / "ft" / METRICS_FILE).open()]
    assert any(e.get("event") == "warm_start" and e["from"] == str(artifact) for e in events)

    trusted = ["--trusted", str(signer.path.parent)]
    head = tmp_path / "ck" / "ft" / step_dir_name(10)
    audit = recovery("audit", str(head), "--root", str(tmp_path / "ck"), *trusted, signer=signer)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "imported from lightning" in audit.stdout
    assert "-- imported weights (lightning" in audit.stdout


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_the_command_refuses_a_payload_in_one_line_without_running_it(tmp_path, signer):
    torch.save({"w": torch.ones(2), "x": Payload(tmp_path / "PWNED")}, tmp_path / "model.ckpt")
    done = recovery(
        "import", str(tmp_path / "model.ckpt"), "--out", str(tmp_path / "o"), signer=signer
    )
    assert done.returncode == 10
    assert done.stderr.count("\n") == 1 and "posix.system" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "o").exists()
