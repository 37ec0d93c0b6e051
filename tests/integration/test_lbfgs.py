"""An own loop trained with L-BFGS (tests/fixtures/lbfgs_loop.py), SIGKILLed between two
checkpoints and run again: it resumes (L-BFGS's flat history fits the optimizer that wrote
it) and trains the uninterrupted run bit for bit, and its self-check says so."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from recovery.format.layout import step_dir_name
from recovery.integrity.keys.trust import KEY_ENV
from recovery.run.journal import effective_steps
from recovery.run.restoring import choose
from recovery.tools.drill import flat_tensors
from tests.integration.conftest import run_killed_at

ROOT = Path(__file__).resolve().parents[2]
LOOP = ROOT / "tests" / "fixtures" / "lbfgs_loop.py"


def train(run_dir: Path, signer, *, pause_at: str | None = None) -> tuple[int, str]:
    env = {**os.environ, KEY_ENV: str(signer.path)}
    cmd = [sys.executable, str(LOOP), "--run-dir", str(run_dir), "--steps", "12", "--every", "4"]
    return run_killed_at(cmd, env=env, cwd=run_dir.parent, pause_at=pause_at, profile="core")


def final(run_dir: Path, trust) -> dict[str, torch.Tensor]:
    loaded = choose.load(run_dir / step_dir_name(12), trust)
    return flat_tensors({k: loaded.decoded.tree[k] for k in ("model", "optimizer")})


def test_lbfgs_killed_and_rerun_trains_the_uninterrupted_run_bit_for_bit(tmp_path, signer, trust):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    code, out = train(reference, signer)
    assert code == 0, out
    code, out = train(killed, signer, pause_at="step-6")  # checkpoint 4 committed
    assert code == -9, out
    code, out = train(killed, signer)
    assert code == 0, out
    assert "does not fit" not in out and "RESUMED run" in out and "at step 4 from" in out, out
    assert "resume check: 2 redone steps bit-identical" in out, out
    a, b = effective_steps(reference / "metrics.jsonl"), effective_steps(killed / "metrics.jsonl")
    assert [a[s]["loss"] for s in sorted(a)] == [b[s]["loss"] for s in sorted(b)]
    want, got = final(reference, trust), final(killed, trust)
    assert want.keys() == got.keys() and any("old_dirs" in k for k in want)
    for key, tensor in want.items():
        assert torch.equal(tensor, got[key]), key
