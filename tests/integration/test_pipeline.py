"""The DVC pipeline on a real copy of the project: dvc repro exports, serving, fresh machines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from recovery import cli
from recovery.format.layout import step_dir_name
from recovery.run.restoring import choose
from recovery.storage import tracking
from tests import launcher
from tests.integration.conftest import ROOT, assert_same_run, console

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def sh(
    cwd: Path, *cmd: str, env: dict[str, str], check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = launcher.run(console(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


@pytest.fixture
def project(tmp_path, signer):
    """A git + DVC copy of the project (code, conf, dvc.yaml) with a local default remote."""
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("train.py", "dvc.yaml", ".dvcignore"):
        shutil.copy(ROOT / name, proj)
    for name in ("conf", "recipes", "recovery"):
        shutil.copytree(ROOT / name, proj / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
        "RECOVERY_SIGNING_KEY": str(signer.path),
        "PYTHONUNBUFFERED": "1",
    }
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    sh(proj, *git, "init", "-q", env=env)
    sh(proj, "dvc", "init", "-q", env=env)
    sh(proj, "dvc", "config", "core.analytics", "false", env=env)
    sh(proj, "dvc", "config", "cache.type", "hardlink,symlink", env=env)
    sh(proj, "dvc", "remote", "add", "-d", "local", str(tmp_path / "remote"), env=env)
    sh(proj, *git, "add", "-A", env=env)
    sh(proj, *git, "commit", "-qm", "base", env=env)
    return proj, env


def test_dvc_repro_exports_then_does_nothing_then_reexports_after_training(project, signer, capsys):
    proj, env = project
    sh(proj, "dvc", "repro", "prepare", env=env)
    train = ["python", "train.py", "checkpoint.every_steps=20"]
    sh(proj, *train, "train.steps=40", env=env)
    first = sh(proj, "dvc", "repro", env=env)
    assert "Running stage 'export'" in first.stdout, first.stdout
    art = proj / "artifacts" / "default"
    digests = {f.name: f.read_bytes() for f in art.iterdir()}
    trusted = ["--trusted", str(signer.path.parent)]
    assert cli.main(["verify", str(art), "--json", *trusted]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["purpose"] == "inference" and info["step"] == 40

    second = sh(proj, "dvc", "repro", env=env)
    assert "Running stage 'export'" not in second.stdout, second.stdout
    assert {f.name: f.read_bytes() for f in art.iterdir()} == digests
    # nothing new either: a no-op resume (it journals) and a refused fresh start
    sh(proj, *train, "train.steps=40", "+resume=latest", env=env)
    refused = sh(proj, *train, "train.steps=40", env=env, check=False)
    assert refused.returncode == 13, refused.stderr
    again = sh(proj, "dvc", "repro", env=env)
    assert "Running stage 'export'" not in again.stdout, again.stdout

    sh(proj, *train, "train.steps=60", "+resume=latest", env=env)
    third = sh(proj, "dvc", "repro", env=env)
    assert "Running stage 'export'" in third.stdout
    assert cli.main(["verify", str(art), "--json", *trusted]) == 0
    verified = json.loads(capsys.readouterr().out)
    assert verified["step"] == 60
    # the resume's verdict, signed into the checkpoint's lineage, is carried into the export
    why = "nothing to compare: no step was journaled after this checkpoint"
    assert verified["certificate"] == [
        {"at_step": 40, "check": {"status": "skipped", "reason": why}}
    ]

    # the real model-signing client accepts the artifact
    ok = sh(
        proj,
        str(BIN / "model_signing"),
        "verify",
        "key",
        "--signature",
        str(art / "model.sig"),
        "--public_key",
        str(signer.path.parent / "recovery.pub"),
        str(art),
        env=env,
    )
    assert "succeeded" in (ok.stdout + ok.stderr).lower()

    # the audit walks from the artifact back through the checkpoints to the run's start
    assert (
        cli.main(["audit", str(art), "--root", str(proj / "checkpoints"), "--json", *trusted]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    links = [(ln["relation"], ln["name"], ln["status"]) for ln in report["links"]]
    assert links[0] == ("self", "default", "ok") and report["links"][0]["purpose"] == "inference"
    assert links[1] == ("export", "step-00000060", "ok")
    assert [s["kind"] for s in report["lineage"]] == ["start", "resume", "export"]
    assert report["links"][1]["dataset"].startswith("md5:")  # the DVC version of data/interactions

    # served in a fresh process that cannot import the project's recipes
    ids = sh(
        proj,
        "python",
        "-c",
        (
            "import safetensors.numpy as s, json; "
            "d = s.load_file('data/interactions/ids.safetensors'); "
            "print(json.dumps([d['user_id'][:50].tolist(), d['item_id'][:50].tolist()]))"
        ),
        env=env,
    )
    users, items = json.loads(ids.stdout)
    serve = (
        "import sys, json; sys.modules['recipes'] = None\n"
        "from recovery import load_inference\n"
        "from recovery.integrity.keys.signing import TrustStore\n"
        "t = TrustStore.from_paths([__import__('pathlib').Path(sys.argv[2])])\n"
        "p = load_inference(sys.argv[1], t)\n"
        "u, i = json.loads(sys.argv[3])\n"
        "out = p(user_id=u, item_id=i)\n"
        "print(json.dumps(out['score'].tolist()))\n"
    )
    fresh = tmp_cwd = proj.parent / "elsewhere"
    tmp_cwd.mkdir()
    served = sh(
        fresh,
        sys.executable,
        "-c",
        serve,
        str(art),
        str(signer.path.parent),
        json.dumps([users, items]),
        env=env,
    )
    got = torch.tensor(json.loads(served.stdout))
    tree = choose.load(
        proj / "checkpoints" / "default" / step_dir_name(60), _trust(signer)
    ).decoded.tree
    from recipes.embedding import DotProduct

    model = DotProduct(2000, 1000, 32, 0.1)
    model.load_state_dict(tree["model"])
    model.eval()
    uid = torch.tensor(users)
    iid = torch.tensor(items)
    table_u = tree["model"]["user.weight"].shape[0]
    assert table_u == 2000
    idx_u = torch.searchsorted(_ids(proj)[0], uid)
    idx_i = torch.searchsorted(_ids(proj)[1], iid)
    with torch.no_grad():
        expected = model(idx_u, idx_i)
    assert torch.equal(got, expected)


def _ids(proj: Path) -> tuple[torch.Tensor, torch.Tensor]:
    import safetensors.torch

    d = safetensors.torch.load_file(str(proj / "data" / "interactions" / "ids.safetensors"))
    return d["user_id"], d["item_id"]


def _trust(signer):
    from recovery.integrity.keys.signing import TrustStore

    store = TrustStore()
    store.add_pem(signer.public_pem, source="test")
    return store


def _wait_pushed(run_dir: Path, name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tracking.status(run_dir).get(name, tracking.Status()).pushed:
            return
        time.sleep(0.1)
    pytest.fail(f"{name} was never pushed")


@pytest.fixture
def s3_remote(project):
    """A real S3-compatible server on 127.0.0.1 (moto) as a DVC remote named s3r."""
    import boto3
    from moto.server import ThreadedMotoServer

    proj, env = project
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    creds = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    boto3.client(
        "s3",
        endpoint_url=url,
        **{k.lower(): v for k, v in creds.items() if k != "AWS_DEFAULT_REGION"},
        region_name="us-east-1",
    ).create_bucket(Bucket="recovery-test")
    env.update(creds)
    sh(proj, "dvc", "remote", "add", "s3r", "s3://recovery-test/checkpoints", env=env)
    sh(proj, "dvc", "remote", "modify", "s3r", "endpointurl", url, env=env)
    yield "s3r"
    server.stop()


@pytest.mark.key
@pytest.mark.parametrize("remote", ["local", "s3"])
def test_fresh_machine_resume_from_the_remote_is_bit_identical(
    project, trainer, reference, trust, remote, request
):
    proj, env = project
    name = request.getfixturevalue("s3_remote") if remote == "s3" else "local"
    root = proj / "checkpoints"
    extra = {
        k: env[k]
        for k in (
            "DVC_NO_ANALYTICS",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
        )
        if k in env
    }
    args = ["checkpoint.dvc.push=true", f"checkpoint.dvc.remote={name}"]
    first = trainer(
        root,
        *args,
        pause_at="step-45",
        cwd=proj,
        env_extra=extra,
        before_kill=lambda: _wait_pushed(root / "r", step_dir_name(40)),
    )
    assert first.returncode == -9
    run_dir = root / "r"
    assert tracking.dvc_file(run_dir / step_dir_name(40)).exists()
    # a fresh machine: the .dvc files came with git; no checkpoint directory, no DVC cache
    for step_dir in run_dir.glob("step-*"):
        if step_dir.is_dir():
            shutil.rmtree(step_dir)
    shutil.rmtree(proj / ".dvc" / "cache", ignore_errors=True)
    second = trainer(root, *args, "+resume=latest", cwd=proj, env_extra=extra)
    assert second.returncode == 0, second.output
    assert "fetching it from DVC" in second.output or "fetched" in second.output
    assert_same_run(reference, run_dir, trust)


def test_data_is_modified_only_when_it_differs_and_a_stale_stage_is_said_apart(project, signer):
    proj, env = project
    shutil.copy(ROOT / "dvc.lock", proj)  # as a fresh clone has it
    sh(proj, "dvc", "repro", "prepare", env=env)
    # the committed lock is current: the stage remade the data it records, byte for byte
    assert (proj / "dvc.lock").read_bytes() == (ROOT / "dvc.lock").read_bytes()
    assert "up to date" in sh(proj, "dvc", "status", "prepare", env=env).stdout
    clean = sh(proj, "python", "train.py", "train.steps=10", "run.name=clean", env=env)
    said = clean.stdout + clean.stderr
    assert "differs from its DVC version" not in said and "out of date" not in said
    with open(proj / "recipes" / "prepare.py", "a") as fh:
        fh.write("# a comment: the stage is out of date, its data is not\n")
    stale = sh(proj, "python", "train.py", "train.steps=10", "run.name=stale", env=env)
    said = stale.stdout + stale.stderr
    assert "DVC stage prepare that makes" in said and "recipes/prepare.py" in said
    assert "differs from its DVC version" not in said
    with open(proj / "data" / "interactions" / "meta.json", "a") as fh:
        fh.write(" \n")  # same data for the recipe, different bytes for DVC
    dirty = sh(proj, "python", "train.py", "train.steps=10", "run.name=dirty", env=env)
    assert "differs from its DVC version" in dirty.stdout + dirty.stderr
    store = _trust(signer)
    for name, modified, stage in (
        ("clean", False, None),
        ("stale", False, True),
        ("dirty", True, True),
    ):
        rec = choose.load(proj / "checkpoints" / name / step_dir_name(10), store).manifest.recovery
        dataset = rec["provenance"]["dataset"]
        assert dataset["source"] == "dvc.lock:prepare" and dataset["modified"] is modified
        assert ("+modified:sha256:" in dataset["version"]) is modified
        assert ("stage" in dataset) is bool(stage), dataset
        if stage:
            assert dataset["stage"] == {"name": "prepare", "outdated": ["recipes/prepare.py"]}
    trusted = ["--trusted", str(signer.path.parent)]
    audits = {
        name: sh(proj, "recovery", "audit", str(proj / "checkpoints" / name / step_dir_name(10)),
                 *trusted, env=env).stdout
        for name in ("clean", "stale", "dirty")
    }  # fmt: skip
    stale_stage, modified = "(stage prepare out of date: recipes/prepare.py)", "(modified: not its"
    assert stale_stage not in audits["clean"] and modified not in audits["clean"]
    assert stale_stage in audits["stale"] and modified not in audits["stale"]
    assert modified in audits["dirty"]
