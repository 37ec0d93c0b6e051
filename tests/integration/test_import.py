"""``recovery import`` as a user runs it: a Lightning-shaped checkpoint of the embedding
model becomes an artifact ``python train.py +init_from=`` starts from, and audits back to;
a checkpoint with a payload is refused by the real command without running it, and so are
files crafted to slip between the scan and torch.load (issue 26)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from recovery.format.layout import METRICS_FILE, step_dir_name
from recovery.integrity.keys.trust import KEY_ENV
from tests import launcher
from tests.integration.conftest import STEPS
from tests.unit import torchfiles

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


# -- issue 26: files crafted to slip between the scan and torch.load ---------------------


def measured(tmp_path: Path, *argv: str, signer) -> tuple[int, str, str, int]:
    """Run the real ``recovery`` entry point in a fresh interpreter: its exit code, stdout,
    stderr and peak resident memory in bytes (``wait4``: this one child's own)."""
    env = {**os.environ, KEY_ENV: str(signer.path)}
    with open(tmp_path / "out.txt", "w+") as out, open(tmp_path / "err.txt", "w+") as err:
        proc = subprocess.Popen([RECOVERY, *argv], stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        return proc.returncode, out.read(), err.read(), usage.ru_maxrss * 1024


def one_line(stderr: str, *fragments: str) -> None:
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert "Traceback" not in stderr and "Weights only load failed" not in stderr, stderr
    for fragment in fragments:
        assert fragment in stderr, stderr


@pytest.fixture
def decoy(tmp_path) -> Path:
    path = tmp_path / "decoy-secret"
    path.write_text("aws_secret_access_key = DECOYDECOYDECOY\n")
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("attack", ["case", "two-directories"])
def test_a_pickle_torch_would_find_that_the_scan_did_not_read_is_refused(
    tmp_path, signer, decoy, attack
):
    # torch.load's reader finds data.pkl ignoring case (archive/DATA.PKL), or in the central
    # directory the end record points at (not the one zipfile reads): the scan reads that one
    payload = pickle.dumps(torchfiles.Payload(decoy), protocol=2)
    if attack == "case":
        entries = [
            ("archive/DATA.PKL", payload) if name == "archive/data.pkl" else (name, blob)
            for name, blob in torchfiles.members(torchfiles.saved({"w": torch.ones(2)}))
        ]
        data = torchfiles.zipped([*entries, ("archive/x/data.pkl", torchfiles.dumps({}))])
    else:
        data = torchfiles.two_directories(payload)
    (tmp_path / "evil.pt").write_bytes(data)
    before = digest(decoy)
    done = recovery(
        "import", str(tmp_path / "evil.pt"), "--out", str(tmp_path / "o"), signer=signer
    )
    assert done.returncode == 10, done.stderr
    expected = "reads as data.pkl (it ignores case)" if attack == "case" else "two directories"
    one_line(done.stderr, "evil.pt: expected", expected, "nothing was unpickled")
    assert digest(decoy) == before and not (tmp_path / "o").exists()


def test_an_expanded_tensor_of_2_to_the_33_elements_is_refused_before_allocating(tmp_path, signer):
    # 4 bytes of storage viewed with stride 0 as 2^33 float32: 32 GiB once materialised
    torch.save({"x": torch.ones(1).expand(1 << 33)}, tmp_path / "big.pt")
    assert (tmp_path / "big.pt").stat().st_size < 4096
    code, _, err, peak = measured(
        tmp_path, "import", str(tmp_path / "big.pt"), "--out", str(tmp_path / "o"), signer=signer
    )
    assert code == 10, err
    one_line(err, "big.pt: expected tensor ['x'] (offset 0, size (8589934592,), stride (0,))")
    assert peak < 2 << 30, f"peak RSS {peak >> 20} MiB"
    assert not (tmp_path / "o").exists()


def test_a_deflate_bomb_is_refused_without_inflating_it(tmp_path, signer):
    torchfiles.bomb(tmp_path / "bomb.pt", numel=1 << 26)  # 256 MiB of zeros, ~256 KiB here
    torch.save({"w": torch.ones(2)}, tmp_path / "small.pt")
    code, _, err, baseline = measured(
        tmp_path, "import", str(tmp_path / "small.pt"), "--out", str(tmp_path / "ok"), signer=signer
    )
    assert code == 0, err
    code, _, err, peak = measured(
        tmp_path, "import", str(tmp_path / "bomb.pt"), "--out", str(tmp_path / "o"), signer=signer
    )
    assert code == 10, err
    one_line(err, "archive/data/0 stored uncompressed", "would become 268435456", "not opened")
    assert peak < baseline + (64 << 20), f"peak {peak >> 20} MiB, a plain import {baseline >> 20}"
    assert not (tmp_path / "o").exists()


def hf_snapshot(root: Path) -> Path:
    """A Hugging Face cache repository: blobs named by sha256, a snapshot linking to them."""
    repo = root / "models--org--tiny"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    files = {
        "config.json": json.dumps({"model_type": "tiny"}).encode(),
        "model.safetensors": safetensors.torch.save({"w": torch.randn(3, 2)}),
    }
    for name, blob in files.items():
        sha = hashlib.sha256(blob).hexdigest()
        (repo / "blobs" / sha).write_bytes(blob)
        (snap / name).symlink_to(f"../../blobs/{sha}")
    return snap


def test_hf_cache_links_are_followed_and_a_link_out_is_refused(tmp_path, signer, decoy):
    snap = hf_snapshot(tmp_path / "hub")
    done = recovery("import", str(snap), "--out", str(tmp_path / "ok"), signer=signer)
    assert done.returncode == 0, done.stderr
    assert "config.json" in done.stdout and "model_config from config.json" in done.stdout

    before, secret = digest(decoy), decoy.read_bytes().strip()
    (snap / "config.json").unlink()
    (snap / "config.json").symlink_to(decoy)
    done = recovery("import", str(snap), "--out", str(tmp_path / "o"), signer=signer)
    assert done.returncode == 5, done.stderr
    one_line(done.stderr, "config.json: expected a file, or a link into", str(decoy))
    assert secret.decode() not in done.stderr
    assert digest(decoy) == before and not (tmp_path / "o").exists()
    for written in (tmp_path / "ok").rglob("*"):
        assert not written.is_file() or secret not in written.read_bytes()
