"""Which verifier accepts which checkpoint: the real OpenSSF model-signing client.

The default (sharded files, sha256) passes ``model_signing verify key``, the
CLI, unchanged; a ``checkpoint.hash=blake3`` one passes model-signing's Python
API, which reads the hash from the manifest, and is refused by the CLI
(1.1.1), which always hashes sha256: the README says so. A file signed in that
nothing in ``state.json`` claims passes model-signing (the signature is sound)
and is refused by ``recovery verify`` (exit 7).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model_signing import verifying
from torch import nn

import recovery
from recovery.format.layout import step_dir_name
from tests import launcher
from tests.conftest import resign

pytestmark = pytest.mark.integration

MODEL_SIGNING = Path(sys.executable).with_name("model_signing")


def checkpoint(tmp_path: Path, signer, trust, **cfg) -> Path:
    """A continuation checkpoint of a 6-layer model whose components are sharded."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(64, 64) for _ in range(6)))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    absent = {"scheduler": "none", "sampler": "none"}
    state = recovery.TrainState(model=model, optimizer=opt, absent=absent)
    config = recovery.CheckpointConfig(every_steps=1, shard_mb=0.02, **cfg)
    kw = {"signer": signer, "trust": trust, "preemption": False, "health": False}
    with recovery.Checkpointer(config, tmp_path / "run", final_step=1, **kw) as ckpt:
        ckpt.maybe_save(state, 1)
    final = tmp_path / "run" / step_dir_name(1)
    names = {p.name for p in final.iterdir()}
    assert {"model.safetensors.index.json", "optimizer.safetensors.index.json"} <= names
    assert sum(".safetensors" in n and "-of-" in n for n in names) >= 4
    return final


def public_key(tmp_path: Path, signer) -> Path:
    pub = tmp_path / "recovery.pub"
    pub.write_bytes(signer.public_pem)
    return pub


def cli_verify(artifact: Path, pub: Path) -> subprocess.CompletedProcess[str]:
    cmd = [str(MODEL_SIGNING), "verify", "key", "--signature", str(artifact / "model.sig")]
    return launcher.run(
        [*cmd, "--public_key", str(pub), str(artifact)], capture_output=True, text=True
    )


def api_verify(artifact: Path, pub: Path) -> None:
    verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(
        artifact, artifact / "model.sig"
    )


def test_the_model_signing_cli_verifies_a_sharded_default_checkpoint(tmp_path, signer, trust):
    final = checkpoint(tmp_path, signer, trust)
    pub = public_key(tmp_path, signer)
    ok = cli_verify(final, pub)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    api_verify(final, pub)
    shard = next(final.glob("optimizer-00002-of-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    bad = cli_verify(final, pub)
    assert bad.returncode != 0 and "optimizer-00002" in bad.stdout + bad.stderr


def test_the_api_verifies_a_blake3_checkpoint_and_the_cli_refuses_it(tmp_path, signer, trust):
    final = checkpoint(tmp_path, signer, trust, hash="blake3")
    pub = public_key(tmp_path, signer)
    api_verify(final, pub)  # raises on any failure
    refused = cli_verify(final, pub)
    assert refused.returncode != 0  # the CLI hashes sha256 whatever the manifest names
    # and recovery's own reader accepts it as its signer wrote it
    cmd = [str(Path(sys.executable).with_name("recovery")), "verify", str(final)]
    out = launcher.run([*cmd, "--trusted", str(pub), "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)
    shard = next(final.glob("model-00001-of-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        api_verify(final, pub)
    damaged = launcher.run([*cmd, "--trusted", str(pub)], capture_output=True, text=True)
    assert damaged.returncode != 0 and "expected blake3" in damaged.stdout + damaged.stderr


def sign_in(final: Path, signer, name: str, data: bytes) -> None:
    """Add ``name`` to ``final`` and sign the directory again with ``signer``, properly: a
    key holder's (or a broken tool's) addition that only a check of what the files mean
    can catch."""
    (final / name).parent.mkdir(parents=True, exist_ok=True)
    (final / name).write_bytes(data)

    def edit(st):
        resources = st["predicate"]["resources"]
        resources.append(
            {"name": name, "algorithm": "sha256", "digest": hashlib.sha256(data).hexdigest()}
        )
        resources.sort(key=lambda r: r["name"])
        st["predicate"]["recovery"]["sizes"][name] = len(data)

    resign(final, signer, edit)


@pytest.mark.parametrize(
    "extra",
    [
        "notes.safetensors",  # no component of that name
        "model-00009-of-00009.safetensors",  # a shard the model's index does not name
        "ranks/rank-00000.json",  # a distributed checkpoint's file in a single-process one
        "program.pt2",  # an inference artifact's role in a training checkpoint
    ],
)
def test_a_signed_file_nothing_claims_is_refused_with_exit_7(tmp_path, signer, trust, extra):
    final = checkpoint(tmp_path, signer, trust)
    sign_in(final, signer, extra, (final / "rng.safetensors").read_bytes())
    pub = public_key(tmp_path, signer)
    if extra == "notes.safetensors":  # the signature is sound: model-signing accepts it
        ok = cli_verify(final, pub)
        assert ok.returncode == 0, ok.stdout + ok.stderr
    cmd = [str(Path(sys.executable).with_name("recovery")), "verify", str(final)]
    out = launcher.run([*cmd, "--trusted", str(pub)], capture_output=True, text=True)
    assert out.returncode == 7 and out.stdout == "", out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"error: {final}: its signed manifest lists ['{extra}'], which no ")
    assert "expected only state.json" in line and "Traceback" not in out.stderr
