"""Shared fixtures: a tiny model's full training state, and a committed checkpoint of it."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from recovery.format import manifest, tensorfile
from recovery.format.layout import SIGNATURE_FILE, step_dir_name
from recovery.integrity import commit
from recovery.integrity.signing import Signer, TrustStore, generate_keypair
from recovery.provenance import capture as provenance
from recovery.provenance.purpose import BUILTIN
from recovery.state import snapshot
from recovery.state.registry import TrainState
from recovery.state.sampler import ResumableSampler
from tests import launcher


def tensor_bytes(tensors) -> bytes:
    """A safetensors file's bytes, as the streaming writer lays them out."""
    return b"".join(bytes(part) for part in tensorfile.chunks(tensors))


def tensors_from(data: bytes) -> dict:
    """Tensors of a safetensors file's bytes, read the way the verifier reads them."""
    return tensorfile.views(torch.frombuffer(bytearray(data), dtype=torch.uint8), name="t")


def make_signer(directory: Path) -> Signer:
    """A signer whose key pair lives in ``directory`` (created once)."""
    if not (directory / "recovery.key").exists():
        generate_keypair(directory)
    return Signer(directory / "recovery.key")


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory) -> Path:
    """A directory every pytest-xdist worker of this session shares (the session's own
    base directory without xdist): what one worker makes there, the others reuse."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # .../pytest-N/popen-gwK -> .../pytest-N, this session's
    path = base / "shared"
    path.mkdir(exist_ok=True)
    return path


def once(directory: Path, make: Callable[[Path], object]) -> Path:
    """``make(directory)`` run by one worker of the session; the others wait for it to
    finish and reuse the directory. A failed ``make`` leaves nothing: the next caller
    tries again (and fails the same way, in its own test)."""
    done = directory.with_name(directory.name + ".done")
    with open(directory.with_name(directory.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            make(directory)
            done.touch()
    return directory


@pytest.fixture(scope="session")
def signer(shared_dir) -> Signer:
    """The test key, one for the whole session (the workers' shared references are signed
    with it)."""
    return Signer(once(shared_dir / "keys", generate_keypair) / "recovery.key")


@pytest.fixture(scope="session")
def trust(signer) -> TrustStore:
    store = TrustStore()
    store.add_pem(signer.public_pem, source="test key")
    return store


@pytest.fixture(scope="session")
def prov() -> dict:
    return provenance.capture(config={"seed": 0})


def tiny_state(seed: int = 0, width: int = 4) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, width), torch.nn.Dropout(0.2), torch.nn.Linear(width, 1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    sampler = ResumableSampler(32, 8, seed=seed)
    return TrainState(model=model, optimizer=opt, scheduler=sched, sampler=sampler)


def train_steps(state: TrainState, n: int) -> list[float]:
    model, opt, sched = (state.components[k] for k in ("model", "optimizer", "scheduler"))
    sampler = state.components["sampler"]
    losses = []
    for _ in range(n):
        _, ids = sampler.next_batch()
        x = (
            torch.arange(len(ids) * 3, dtype=torch.float32).reshape(-1, 3) / 10
            + torch.from_numpy(ids)[:, None]
        )
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def commit_state(run_dir, state: TrainState, step: int, signer: Signer, **extra):
    """Commit ``state`` as a continuation checkpoint the way the checkpointer does."""
    run_dir.mkdir(parents=True, exist_ok=True)
    files = snapshot.encode(
        state.state_dict(), step=step, meta={"run_id": "r"}, config_yaml="seed: 0\n"
    )
    statement = {
        "step": step,
        "purpose": "continuation",
        "requires": BUILTIN["continuation"].requires,
        "provenance": {"tool": {"name": "recovery"}},
        **extra,
    }
    return commit.commit(run_dir / step_dir_name(step), files, statement, signer=signer)


def resign(path: Path, signer: Signer, edit) -> None:
    """Apply ``edit`` to the statement in ``path``'s model.sig and sign it again with ``signer``."""
    bundle = json.loads((path / SIGNATURE_FILE).read_bytes())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    edit(statement)
    res = statement["predicate"]["resources"]
    recs = [manifest.FileRecord(r["name"], r["digest"], 0) for r in res]
    statement["subject"][0]["digest"]["sha256"] = manifest.root_digest(recs)
    (path / SIGNATURE_FILE).write_bytes(signer.sign(manifest.payload(statement)))


@pytest.fixture
def checkpoint(tmp_path, signer):
    """A committed checkpoint of a tiny model after 3 steps: (path, state)."""
    state = tiny_state()
    train_steps(state, 3)
    commit_state(tmp_path / "run", state, 3, signer)
    return tmp_path / "run" / step_dir_name(3), state


@pytest.fixture(autouse=True, scope="session")
def _launched():
    """Test processes start from the preloaded launcher (:mod:`tests.launcher`), drills'
    runs included; its servers end with the session."""
    launcher.patch_drills()
    yield
    launcher.close_all()


@pytest.fixture(autouse=True, scope="session")
def _per_user_config(tmp_path_factory):
    """The per-user dev key directory ($XDG_CONFIG_HOME) of the tests: never the real ~/.config."""
    import os

    before = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("xdg-config"))
    yield
    if before is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = before
