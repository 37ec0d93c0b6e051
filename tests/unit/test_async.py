"""Async saves: the pause is a copy, the snapshot is the step boundary, errors surface."""

import os
import signal
import threading

import pytest
import torch

from recovery.config import CheckpointConfig
from recovery.errors import CommitError, Preempted
from recovery.format.layout import scan, step_dir_name
from recovery.integrity import commit
from recovery.run import resume
from recovery.run.cadence import Cadence
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal, read
from recovery.run.preemption import PreemptionGuard
from recovery.run.staging import Staging
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
    saved = resume.load(tmp_path / "run" / step_dir_name(2), trust).decoded.tree
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
        out[mode] = resume.load(tmp_path / str(mode) / "run" / step_dir_name(6), trust).decoded.tree
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


def test_background_error_surfaces_on_the_next_step(tmp_path, signer, trust, prov, monkeypatch):
    def broken(*args, **kwargs):
        raise CommitError("disk full (injected)")

    state = tiny_state()
    ck, journal = make(tmp_path, signer, trust, prov, async_save=True, every_steps=2)
    ck.restore(state, None)
    monkeypatch.setattr(commit, "commit", broken)
    train_steps(state, 2)
    ck.maybe_save(state, 2)
    ck._saver._writer._pending.exception(timeout=10)  # let it fail
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
        resume.load(tmp_path / "run" / step_dir_name(4), trust)
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
