"""Async saves: the pause is a copy, the snapshot is the step boundary, errors surface."""

import json
import os
import signal
import socket
import threading
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from recovery.config import CheckpointConfig
from recovery.errors import CommitError, Preempted
from recovery.format.layout import scan, step_dir_name
from recovery.integrity.commits import commit
from recovery.integrity.keys.signing import Signer, TrustStore
from recovery.parallel import sharded
from recovery.parallel import world as distributed
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal, read
from recovery.run.restoring import choose
from recovery.run.scheduling.cadence import Cadence
from recovery.run.scheduling.preemption import PreemptionGuard
from recovery.run.writing.staging import Staging
from recovery.state.registry import TrainState
from recovery.state.sampler import ResumableSampler
from tests.conftest import tiny_state, train_steps


def make(tmp_path, signer, trust, prov, *, steps=10, preemption=None, **cfg):
    journal = Journal(tmp_path / "run" / "metrics.jsonl")
    ck = Checkpointer(
        CheckpointConfig(root=str(tmp_path), keep_last=10, **cfg),
        tmp_path / "run",
        final_step=steps,
        signer=signer,
        trust=trust,
        provenance=prov,
        config={"seed": 0},
        journal=journal,
        preemption=preemption,
    )
    return ck, journal


def test_staging_copies_and_reuses_buffers():
    state = tiny_state()
    staging = Staging()
    first = staging.stage(state.state_dict())
    ptr = first.tensors["model"]["0.weight"].data_ptr()
    w = state.components["model"].state_dict()["0.weight"]
    before = w.clone()
    with torch.no_grad():
        w.add_(1.0)  # training moves on
    assert torch.equal(first.tensors["model"]["0.weight"], before)
    second = staging.stage(state.state_dict())
    assert second.tensors["model"]["0.weight"].data_ptr() == ptr  # allocated once, reused
    assert torch.equal(second.tensors["model"]["0.weight"], w)
    assert staging.allocated_bytes == first.nbytes


def test_async_checkpoint_holds_step_k_although_training_moved_on(
    tmp_path, signer, trust, prov, monkeypatch
):
    """Snapshot isolation: the background commit of step 2 runs only after two more steps."""
    gate = threading.Event()
    real = commit.commit

    def slow_commit(*args, **kwargs):
        gate.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(commit, "commit", slow_commit)
    state = tiny_state()
    ck, journal = make(tmp_path, signer, trust, prov, async_save=True, every_steps=2)
    ck.restore(state, None)
    train_steps(state, 2)
    expected = {k: v.clone() for k, v in state.components["model"].state_dict().items()}
    expected_exp_avg = state.components["optimizer"].state_dict()["state"][0]["exp_avg"].clone()
    ck.maybe_save(state, 2)
    train_steps(state, 2)  # the optimizer updates the live tensors in place
    assert not torch.equal(state.components["model"].state_dict()["0.weight"], expected["0.weight"])
    gate.set()
    ck.flush()
    saved = choose.load(tmp_path / "run" / step_dir_name(2), trust).decoded.tree
    for k, v in expected.items():
        assert torch.equal(saved["model"][k], v), k
    assert torch.equal(saved["optimizer"]["state"][0]["exp_avg"], expected_exp_avg)
    ck.close()
    journal.close()


def test_async_and_sync_write_identical_state(tmp_path, signer, trust, prov):
    out = {}
    for mode in (False, True):
        state = tiny_state()
        ck, journal = make(
            tmp_path / str(mode), signer, trust, prov, async_save=mode, every_steps=3, steps=6
        )
        ck.restore(state, None)
        for step in range(1, 7):
            train_steps(state, 1)
            ck.maybe_save(state, step)
        ck.close()
        journal.close()
        out[mode] = choose.load(tmp_path / str(mode) / "run" / step_dir_name(6), trust).decoded.tree
        events = [
            r
            for r in read(tmp_path / str(mode) / "run" / "metrics.jsonl")
            if r.get("event") == "checkpoint"
        ]
        assert [e["step"] for e in events] == [3, 6]
        assert all(e["mode"] == ("async" if mode else "sync") and e["bytes"] > 0 for e in events)
        assert {e["max_loss_intervals"] for e in events} == {2 if mode else 1}
        summary = [
            r
            for r in read(tmp_path / str(mode) / "run" / "metrics.jsonl")
            if r.get("event") == "run_summary"
        ]
        assert 0 < summary[0]["checkpoint_fraction"] < 1
    for k, v in out[False]["model"].items():
        assert torch.equal(out[True]["model"][k], v)


def test_a_sync_save_of_a_device_state_goes_through_reused_staging_buffers(
    tmp_path, signer, trust, prov, monkeypatch
):
    """A state off the host is staged (one copy into reused buffers), then written from
    them on the training thread: the same bytes as a host state's save. Here the state is
    on the CPU, taken for a device's; on the host itself nothing is staged."""
    from recovery.run.writing import oneprocess

    trees = {}
    for device in (False, True):
        monkeypatch.setattr(oneprocess, "on_device", lambda tree, device=device: device)
        state = tiny_state()
        ck, journal = make(tmp_path / str(device), signer, trust, prov, every_steps=2, steps=6)
        ck.restore(state, None)
        sizes = []
        for step in range(1, 7):
            train_steps(state, 1)
            ck.maybe_save(state, step)
            sizes.append(ck._saves.strategy._staging.allocated_bytes)
        ck.close()
        journal.close()
        staged = sizes[-1]
        assert (staged > 0) == device and sizes[1] == staged  # allocated once, then reused
        trees[device] = choose.load(tmp_path / str(device) / "run" / step_dir_name(6), trust)
    for k, v in trees[False].decoded.tree["model"].items():
        assert torch.equal(trees[True].decoded.tree["model"][k], v)


def test_background_error_surfaces_on_the_next_step(tmp_path, signer, trust, prov, monkeypatch):
    def broken(*args, **kwargs):
        raise CommitError("disk full (injected)")

    state = tiny_state()
    ck, journal = make(tmp_path, signer, trust, prov, async_save=True, every_steps=2)
    ck.restore(state, None)
    monkeypatch.setattr(commit, "commit", broken)
    train_steps(state, 2)
    ck.maybe_save(state, 2)
    ck._saves.strategy._writer._pending.exception(timeout=10)  # let it fail
    train_steps(state, 1)
    with pytest.raises(CommitError, match="background checkpoint save failed.*disk full"):
        ck.maybe_save(state, 3)
    assert scan(tmp_path / "run").committed == []
    ck.close()
    journal.close()


def test_preemption_checkpoints_at_the_boundary_and_stops(tmp_path, signer, trust, prov):
    guard = PreemptionGuard(["SIGUSR1"]).install()
    try:
        state = tiny_state()
        ck, journal = make(
            tmp_path, signer, trust, prov, async_save=True, every_steps=100, preemption=guard
        )
        ck.restore(state, None)
        train_steps(state, 3)
        assert ck.maybe_save(state, 3) is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert guard.requested == "SIGUSR1"
        train_steps(state, 1)
        with pytest.raises(Preempted) as err:
            ck.maybe_save(state, 4)
        assert err.value.step == 4
        assert [s for s, _ in scan(tmp_path / "run").committed] == [4]
        choose.load(tmp_path / "run" / step_dir_name(4), trust)
        events = [r["event"] for r in read(tmp_path / "run" / "metrics.jsonl")]
        assert "preempted" in events
        ck.close()
        journal.close()
    finally:
        guard.uninstall()


def test_auto_cadence_follows_young_daly():
    now = [0.0]
    cad = Cadence(
        CheckpointConfig(interval="auto", mtbf="1h", every_steps=5),
        final_step=1000,
        clock=lambda: now[0],
    )
    assert not cad.due(4) and cad.due(5)  # every_steps until a save is measured
    cad.saved(5)
    cad.measured(cost_s=0.5, persist_s=1.0)
    assert cad.interval_s == pytest.approx((2 * 0.5 * 3600) ** 0.5)  # 60 s
    now[0] = 59.0
    assert not cad.due(10)
    now[0] = 61.0
    assert cad.due(11)
    cad.measured(cost_s=0.001, persist_s=30.0)  # mean cost 0.2505 s, persist 15.5 s
    assert cad.interval_s == pytest.approx(max((2 * 0.2505 * 3600) ** 0.5, 15.5))
    assert cad.describe()["formula"].startswith("max(sqrt(2")


def test_staging_a_dcp_tree_keeps_its_structure_and_reuses_buffers():
    state = tiny_state()
    opt = state.components["optimizer"]
    train_steps(state, 1)
    tree = {"model": state.components["model"].state_dict(), "optimizer": opt.state_dict()}
    staging = Staging()
    first = staging.stage_tree(tree, "dcp")
    assert first["optimizer"]["param_groups"] == tree["optimizer"]["param_groups"]
    live = tree["optimizer"]["state"][0]["exp_avg"]
    staged = first["optimizer"]["state"][0]["exp_avg"]
    assert torch.equal(staged, live) and staged.data_ptr() != live.data_ptr()
    train_steps(state, 1)  # training moves on; the snapshot does not
    assert not torch.equal(staged, live)
    again = staging.stage_tree(tree, "dcp")
    assert again["optimizer"]["state"][0]["exp_avg"].data_ptr() == staged.data_ptr()
    assert torch.equal(again["optimizer"]["state"][0]["exp_avg"], live)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ranks_run(root: Path, key: str, strategy: str, mode: str) -> dict:
    """Six steps of a 2-rank job saving at 2, 4 and 6 (``mode``: sync, async, or async
    with rank 1 failing to write its files at step 4); what this rank saw."""
    world = distributed.current()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model[0])
        fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    state = TrainState(
        model=model, optimizer=opt, scheduler=sched, sampler=ResumableSampler(8, 4, 0)
    )
    signer = Signer(Path(key))
    trust = TrustStore()
    trust.add_pem(signer.public_pem, source="test key")
    gate = threading.Event()
    real_write, real_rank = sharded.write, sharded.write_rank

    def late_write(*args, **kwargs):  # the background writes only once training moved on
        if threading.current_thread() is not threading.main_thread():
            gate.wait(20)
        return real_write(*args, **kwargs)

    def failing_rank(directory, rank, tree):
        if mode == "fail" and rank == 1 and "step-00000004" in str(directory):
            raise OSError("disk full (injected)")
        return real_rank(directory, rank, tree)

    sharded.write, sharded.write_rank = late_write, failing_rank
    cfg = CheckpointConfig(root=str(root), every_steps=2, keep_last=10, async_save=mode != "sync")
    ck = Checkpointer(
        cfg,
        root / "run",
        final_step=6,
        signer=signer,
        trust=trust,
        provenance={"note": "test"},
        config={"seed": 0},
        preemption=False,
        health=False,
        world=world,
        strategy=strategy,
    )
    seen: dict = {"failed_at": None}
    try:
        ck.restore(state, None)
        for step in range(1, 7):
            opt.zero_grad()
            model(torch.full((4, 3), float(step))).pow(2).mean().backward()
            opt.step()
            sched.step()
            if step == 3:
                gate.set()
            try:
                ck.maybe_save(state, step)
            except CommitError as err:
                seen.update(failed_at=step, error=str(err))
                break
        ck.close()
    finally:
        sharded.write, sharded.write_rank = real_write, real_rank
    return seen


def _ranks_job(rank: int, port: int, root: str, key: str, strategy: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        out = {mode: _ranks_run(Path(root) / mode, key, strategy, mode) for mode in MODES}
        Path(root, f"result-{rank}.json").write_text(json.dumps(out))
    finally:
        torch.distributed.destroy_process_group()


MODES = ("sync", "async", "fail")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_async_saves_across_two_ranks_write_what_sync_saves_write(
    strategy, tmp_path, signer, trust
):
    """The snapshot is each rank's step boundary although the background wrote after the
    next step; every file equals the sync save's except DCP's metadata (it records the
    temp path and a save id); a rank failing in the background fails the save on every
    rank, raised at the same step, and commits nothing."""
    # forked: the ranks need not import torch again (this process holds no process group)
    args = (_free_port(), str(tmp_path), str(signer.path), strategy)
    mp.start_processes(_ranks_job, args=args, nprocs=2, start_method="fork")
    seen = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in (0, 1)]
    assert [s["sync"]["failed_at"] for s in seen] == [None, None]
    assert [s["async"]["failed_at"] for s in seen] == [None, None]
    for step in (2, 4, 6):
        name = step_dir_name(step)
        sync, async_ = tmp_path / "sync" / "run" / name, tmp_path / "async" / "run" / name
        choose.load(async_, trust)  # verifies: signed, every file listed
        files = sorted(p.relative_to(sync).as_posix() for p in sync.rglob("*") if p.is_file())
        assert files == sorted(
            p.relative_to(async_).as_posix() for p in async_.rglob("*") if p.is_file()
        )
        for f in files:
            if f.startswith(("dcp/__", "ranks/")):
                assert (sync / f).read_bytes() == (async_ / f).read_bytes(), f"{name}/{f}"
    events = [e for e in read(tmp_path / "async" / "run" / "metrics.jsonl") if "mode" in e]
    assert [(e["step"], e["mode"]) for e in events] == [(2, "async"), (4, "async"), (6, "async")]
    assert all(e["pause_s"] > 0 and e["write_s"] > 0 for e in events)

    failed = [s["fail"] for s in seen]
    assert failed[0]["failed_at"] == failed[1]["failed_at"] is not None  # the same step
    assert "a rank could not write its state" in failed[0]["error"]
    assert "disk full (injected)" in failed[1]["error"]
    listing = scan(tmp_path / "fail" / "run")
    assert [s for s, _ in listing.committed] == [2] and not listing.stale  # abandoned, removed
