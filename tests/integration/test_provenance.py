"""Signed provenance on real runs: drift, secrets, lineage audits, model-signing interop."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.numpy

from recovery import cli
from recovery.format.layout import step_dir_name
from recovery.run.journal import read
from tests import launcher
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration

MODEL_SIGNING = Path(sys.executable).with_name("model_signing")
SECRETS = ["+db.password=hunter2-SECRET", "+api_token=tok-SECRET"]


def model_signing_verify(artifact: Path, pub: Path) -> subprocess.CompletedProcess[str]:
    """The OpenSSF client, verifying ``artifact`` with the public key ``pub``."""
    cmd = [str(MODEL_SIGNING), "verify", "key", "--signature", str(artifact / "model.sig")]
    return launcher.run(
        [*cmd, "--public_key", str(pub), str(artifact)], capture_output=True, text=True
    )


@pytest.fixture
def project(tmp_path):
    """A git-committed copy of the project's training code, so its tree can be made dirty."""
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(ROOT / "train.py", proj)
    for name in ("conf", "recipes"):
        shutil.copytree(ROOT / name, proj / name, ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(proj), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    launcher.run([*git, "init", "-q"], check=True)
    launcher.run([*git, "add", "-A"], check=True)
    launcher.run([*git, "commit", "-qm", "base"], check=True)
    return proj


def test_drift_on_resume_is_reported_exactly_and_strict_refuses(tmp_path, trainer, project, signer):
    data = tmp_path / "data"
    root = tmp_path / "ck"
    first = trainer(root, "train.steps=20", script=project / "train.py", data=data)
    assert first.returncode == 0, first.output

    # three kinds of drift: a dirty tree, changed data, a changed config key
    with open(project / "recipes" / "embedding.py", "a") as fh:
        fh.write("\n# a local edit\n")
    shard = sorted(data.glob("shard-*.safetensors"))[0]
    arrays = safetensors.numpy.load_file(str(shard))
    arrays["label"] = 1.0 - arrays["label"]
    safetensors.numpy.save_file(arrays, str(shard))
    changed = ["train.steps=30", "recipe.optim.lr=0.02", "+resume=latest"]

    strict = trainer(
        root, *changed, "checkpoint.strict_resume=true", script=project / "train.py", data=data
    )
    assert strict.returncode == 19, strict.output
    for expected in (
        "code: uncommitted changes differ",
        "dataset: sha256:",
        "config: recipe.optim.lr: 0.01 -> 0.02",
    ):
        assert expected in strict.output
    assert "strict_resume" not in strict.output.split("differences:")[-1]

    loose = trainer(root, *changed, script=project / "train.py", data=data)
    assert loose.returncode == 0, loose.output
    assert "DRIFT since step-00000020: config: recipe.optim.lr: 0.01 -> 0.02" in loose.output
    assert "DRIFT since step-00000020: code: uncommitted changes differ" in loose.output
    resumes = [r for r in read(loose.run_dir / "metrics.jsonl") if r.get("event") == "resume"]
    assert any(line.startswith("dataset: ") for line in resumes[-1]["drift"])

    assert (
        cli.main(
            [
                "inspect",
                str(loose.run_dir / step_dir_name(30)),
                "--json",
                "--trusted",
                str(signer.path.parent),
            ]
        )
        == 0
    )


def test_audit_walks_two_resumes_and_a_warm_start_dev_key_secrets_and_model_signing(
    tmp_path, trainer, capsys, monkeypatch
):
    root = tmp_path / "ck"
    common = ["train.steps=60", *SECRETS]
    outputs = []
    for extra, pause in (
        ([], "step-25"),
        (["+resume=latest"], "step-45"),
        (["+resume=latest"], None),
    ):
        result = trainer(root, *common, *extra, pause_at=pause, dev_key=True)
        assert result.returncode == (-9 if pause else 0), result.output
        outputs.append(result.output)
    assert "created a DEV signing key" in outputs[0]
    assert not any("created a DEV signing key" in out for out in outputs[1:])
    source = root / "r" / step_dir_name(60)
    ws = trainer(
        root, "run.name=ws", "train.steps=20", f"+init_from={source}", *SECRETS, dev_key=True
    )
    assert ws.returncode == 0, ws.output
    head = root / "ws" / step_dir_name(20)

    # no secret reaches any byte written under the checkpoint root
    for f in root.rglob("*"):
        if f.is_file() and ".recovery" not in f.parts:
            assert b"SECRET" not in f.read_bytes(), f

    # the audit: the whole chain, from the command line, trusting the local dev key
    monkeypatch.chdir(root)
    assert cli.main(["audit", str(head), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["kind"] for s in report["lineage"]] == ["start", "resume", "resume", "warm_start"]
    chain = [(ln["relation"], ln["name"], ln["status"]) for ln in report["links"]]
    assert chain == [
        ("self", "step-00000020", "ok"),
        ("previous", "step-00000010", "ok"),
        ("warm_start", "step-00000060", "ok"),
        ("previous", "step-00000050", "ok"),
        ("resume", "step-00000040", "ok"),
        ("previous", "step-00000030", "pruned"),
        ("resume", "step-00000020", "pruned"),
    ]
    assert report["links"][0]["signer"]["dev"] and report["links"][0]["signer"]["trusted"]
    assert report["links"][0]["dataset"].startswith("sha256:")
    assert len({ln["run_id"] for ln in report["links"]}) == 2
    assert cli.main(["audit", str(head)]) == 0
    text = capsys.readouterr().out
    assert "dev key, trusted" in text and "pruned" in text and "start of run" in text
    assert text.count("\n  [") == 7

    # the real model-signing client accepts our checkpoints and rejects tampered ones
    pub = root / ".recovery" / "dev-key" / "recovery.pub"
    for artifact in (head, source):
        ok = model_signing_verify(artifact, pub)
        assert ok.returncode == 0, ok.stdout + ok.stderr
    tampered = root / "ws" / step_dir_name(10)
    data = bytearray((tampered / "model.safetensors").read_bytes())
    data[-5] ^= 0xFF
    (tampered / "model.safetensors").write_bytes(bytes(data))
    bad = model_signing_verify(tampered, pub)
    assert bad.returncode != 0 and "mismatch" in (bad.stdout + bad.stderr).lower()

    # a damaged ancestor fails the audit, named, with its error's exit code
    assert cli.main(["audit", str(head)]) == 9
    captured = capsys.readouterr()
    assert "FAILED at step-00000010" in captured.out and "step-00000010" in captured.err
