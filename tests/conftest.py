"""Shared fixtures: a tiny model's full training state, and a committed checkpoint of it."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

# One torch thread in every test process and every process a test starts (they inherit
# it; set before torch is first imported, which reads it then): the models are tiny, and
# on CI's 2 cores, shared by two pytest workers, a pool of spinning threads per process
# more than doubled the CPU time (see demo.py). Every run a test compares runs with it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

from recovery.format import manifest, tensorfile
from recovery.format.layout import SIGNATURE_FILE, step_dir_name
from recovery.integrity.commits import commit
from recovery.integrity.keys.signing import Signer, TrustStore, generate_keypair
from recovery.provenance import capture as provenance
from recovery.provenance.purpose import BUILTIN
from recovery.state import snapshot
from recovery.state.registry import TrainState
from recovery.state.sampler import ResumableSampler
from tests import launcher, system


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


def record_and_save(ck, state: TrainState, steps: range) -> None:
    """Through a checkpointer ``ck``: train each of ``steps`` (one step each), record it
    in the journal and save when due."""
    for step in steps:
        ck.record(step, loss=train_steps(state, 1)[0])
        ck.maybe_save(state, step)


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
def _launched(shared_dir):
    """Test processes start from the preloaded launcher (:mod:`tests.launcher`), drills'
    runs included; its servers are shared by the session's workers (one preload each,
    not one per worker) and end with the session (its controller, under xdist)."""
    xdist = bool(os.environ.get("PYTEST_XDIST_WORKER"))
    launcher.share(shared_dir, os.getppid() if xdist else os.getpid())
    launcher.patch_drills()
    yield
    launcher.close_all()


@pytest.fixture(autouse=True)
def _copies_launched():
    """A test's copy of the project gets a launcher server of its own (the first command
    that runs the copy's code starts it), which ends with the test."""
    yield
    launcher.close_copies()


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


# Rough seconds per test (measured with `--durations` in make test, 3 workers on 2 cores):
# the files whose tests start real processes, and the longest tests by name. Only the order
# matters.
COST_PER_TEST = {
    "integration/test_pipeline.py": 60,
    "integration/test_classifier.py": 60,
    "integration/test_trackers.py": 60,
    "integration/test_distributed.py": 50,
    "integration/test_differential.py": 45,
    "integration/test_provenance.py": 45,
    "integration/test_drill.py": 40,
    "integration/test_distributed_async.py": 35,
    "integration/test_dvc_exp.py": 35,
    "integration/test_elastic.py": 8,
    "integration/test_bench_smoke.py": 10,
    "integration/test_plain_loop.py": 22,
    "integration/test_examples.py": 18,
    "integration/test_async_preemption.py": 18,
    "integration/test_kill_resume.py": 15,
    "integration/test_storage_faults.py": 12,
    "integration/test_slurm.py": 12,
    "integration/test_tiers.py": 5,
    "integration/test_tracking.py": 8,
    "integration/test_hydra.py": 7,
    "integration/test_health.py": 6,
    "integration/test_import.py": 6,
    "integration/test_run_dir_attacks.py": 6,
    "integration/test_report.py": 5,
    "integration/test_docs_site.py": 12,
    "unit/test_layers.py": 4,
    "unit/test_async.py": 4,
    "integration/test_resume_check.py": 3,
    "integration/test_branches.py": 3,
    "integration/test_drill_command.py": 3,
    "unit/test_launcher.py": 2,
    "unit/test_trackers.py": 2,
}
COST_BY_NAME = {
    "test_the_readmes_commands_work_after_the_demo_and_leave_only_what_they_say": 130,
    "test_dvc_repro_exports_then_does_nothing_then_reexports_after_training": 65,
    "test_dvc_experiments_train_resume_queue_and_show": 85,
    "test_a_job_requeued_by_slurm_and_at_its_time_limit_comes_back_bit_identical": 45,
    "test_data_is_modified_only_when_it_differs_and_a_stale_stage_is_said_apart": 40,
    "test_drift_on_resume_is_reported_exactly_and_strict_refuses": 35,
    "test_time_to_first_resumed_step_is_measured_against_both_baselines": 35,
    "test_drill_passes_with_ten_kills_in_every_window_with_async_writes": 34,
    "test_two_agents_as_two_nodes_killed_and_restarted_resume_bit_identical": 17,
    "test_a_node_lost_with_its_ram_is_restored_from_its_peers_copy_bit_identical": 15,
    "test_a_rank_killed_mid_save_commits_nothing_and_the_job_resumes": 30,
    "test_drill_passes_on_the_classifier_with_workers_amp_and_async_saves": 29,
    "test_torchrun_restarts_a_job_whose_rank_was_killed_and_it_resumes_bit_identical": 15,
    "test_drill_with_a_kill_during_the_dvc_push_and_a_branch": 27,
    "test_killed_and_resumed_run_is_one_mlflow_run_and_one_tensorboard_series": 40,
    "test_a_submitit_job_preempted_mid_step_checkpoints_then_requeues_bit_identical": 23,
    "test_a_two_rank_job_killed_and_resumed_is_bit_identical": 21,
    "test_the_drill_passes_with_differential_saves": 20,
    "test_the_tiers_benchmark_runs_end_to_end": 20,
    "test_a_resume_on_another_world_size_reshards_and_stays_in_the_seed_band": 15,
}


def cost(item: pytest.Item) -> float:
    """The rough cost of ``item`` in seconds (0: a quick test)."""
    name = item.name.split("[")[0]
    if name in COST_BY_NAME:
        return COST_BY_NAME[name]
    path = Path(str(item.fspath))
    return COST_PER_TEST.get(f"{path.parent.name}/{path.name}", 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the costly tests first, dealt across the workers' shares.

    ``--dist worksteal`` gives each of the N workers one contiguous N-th of the list, and
    an idle worker steals from the end of another's share. Each share here starts with
    its part of the costly tests, longest first, dealt round-robin, and ends with quick
    ones in their collection order: no long test starts last while another worker idles.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2 or len(items) < workers:
        return
    costly = sorted((it for it in items if cost(it) > 0), key=cost, reverse=True)
    quick = [it for it in items if cost(it) == 0]
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for i, item in enumerate(costly):
        shares[i % workers].append(item)
    left = len(items)
    for i, share in enumerate(shares):  # the sizes xdist cuts: what is left / workers left
        size = left // (workers - i)
        left -= size
        take = max(0, size - len(share))
        share.extend(quick[:take])
        del quick[:take]
    shares[-1].extend(quick)  # what a costly-heavy share left over
    items[:] = [item for share in shares for item in share]


def pytest_terminal_summary(terminalreporter) -> None:
    """The closing lines name, in one line, what the skipped tests need installed."""
    reasons = []
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report.longrepr, tuple):  # (path, line, "Skipped: <reason>")
            reasons.append(str(report.longrepr[2]))
    if line := system.summary(reasons):
        terminalreporter.write_line(line, yellow=True, bold=True)
