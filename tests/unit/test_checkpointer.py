import pytest
import torch

from recovery.checkpointer import Checkpointer
from recovery.config import CheckpointConfig
from recovery.errors import CheckpointNotFoundError, RunDirInUseError, TruncatedFileError
from recovery.journal import Journal, read
from recovery.layout import scan, step_dir_name
from tests.conftest import tiny_state, train_steps


def run(tmp_path, steps, *, every=2, keep_last=2, keep_every=0, resume=None, state=None):
    state = state or tiny_state()
    journal = Journal(tmp_path / "metrics.jsonl")
    ck = Checkpointer(
        CheckpointConfig(
            root=str(tmp_path), every_steps=every, keep_last=keep_last, keep_every=keep_every
        ),
        tmp_path / "run",
        final_step=steps,
        journal=journal,
    )
    step = ck.restore(state, resume)
    losses = {}
    while step < steps:
        (loss,) = train_steps(state, 1)
        step += 1
        losses[step] = loss
        ck.maybe_save(state, step, metrics={"loss": loss})
    ck.close()
    journal.close()
    return state, losses, ck


def params(state):
    return state.components["model"].state_dict()


def test_resume_latest_continues_exactly(tmp_path):
    ref, ref_losses, _ = run(tmp_path / "a", 9)
    b_dir = tmp_path / "b"
    run(b_dir, 5)  # saves 2, 4 and 5 (its final)
    # pretend the run had been asked for 9 steps: resume from step 5
    state, losses, ck = run(b_dir, 9, resume="latest")
    assert ck.resumed_from.name == step_dir_name(5)
    assert losses == {s: v for s, v in ref_losses.items() if s > 5}
    assert all(torch.equal(params(ref)[k], params(state)[k]) for k in params(ref))
    events = [r for r in read(b_dir / "metrics.jsonl") if r.get("event") == "resume"]
    assert events[0]["step"] == 5


def test_retention_keeps_last_and_milestones(tmp_path):
    run(tmp_path, 12, every=2, keep_last=2, keep_every=4)
    assert [s for s, _ in scan(tmp_path / "run").committed] == [4, 8, 10, 12]


def test_fresh_run_refuses_a_used_run_dir(tmp_path):
    run(tmp_path, 4)
    with pytest.raises(RunDirInUseError, match="resume=latest"):
        run(tmp_path, 4)


def test_latest_falls_back_past_corruption(tmp_path, caplog):
    run(tmp_path, 6, keep_last=3)
    newest = tmp_path / "run" / step_dir_name(6)
    f = newest / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    _, _, ck = run(tmp_path, 6, resume="latest")
    assert ck.resumed_from.name == step_dir_name(4)
    assert "RESUME FALLBACK" in caplog.text and "model.safetensors" in caplog.text


def test_named_step_must_verify(tmp_path):
    run(tmp_path, 6, keep_last=3)
    (tmp_path / "run" / step_dir_name(6) / "state.json").write_text("{}")
    with pytest.raises(TruncatedFileError):
        run(tmp_path, 6, resume=6)
    with pytest.raises(CheckpointNotFoundError, match=r"committed steps: \[2, 4, 6\]"):
        run(tmp_path, 6, resume=3)


def test_resume_latest_with_nothing_starts_fresh(tmp_path, caplog):
    _, losses, ck = run(tmp_path, 3, resume="latest")
    assert ck.resumed_from is None and sorted(losses) == [1, 2, 3]
    assert "starting a fresh run" in caplog.text


def test_resume_by_path(tmp_path):
    run(tmp_path, 4)
    _, losses, _ = run(tmp_path, 6, resume=str(tmp_path / "run" / step_dir_name(4)))
    assert sorted(losses) == [5, 6]
