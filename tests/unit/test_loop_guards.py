"""Guards that see, while a run trains, what a resume's self-check would only find later:
a save before its step's update, a loader on the global stream after a save; and a loop
whose update is hand-written, its optimizer declared absent."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from recovery import CheckpointConfig, Checkpointer, LoopState, TrainState
from recovery.run.journal import read
from recovery.run.monitoring import loaderstarts
from recovery.state.guards import LOADER_AFTER_SAVE, SAVE_BEFORE_STEP

ABSENT = {"scheduler": "constant lr", "sampler": "torch.randn batches"}


def warnings_of(run_dir) -> list[str]:
    return [r["kind"] for r in read(run_dir / "metrics.jsonl") if r.get("event") == "warning"]


def run(tmp_path, body: Callable[..., None], steps: int = 4, **state_kw) -> TrainState:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TrainState(model=model, optimizer=opt, absent=ABSENT, **state_kw)
    with Checkpointer(CheckpointConfig(every_steps=1), tmp_path / "run", final_step=steps) as ck:
        step = ck.restore(state, "latest")
        while step < steps:
            step = body(ck, state, model, opt, step)
    return state


def update(model, opt) -> None:
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()


def test_a_save_before_its_steps_update_is_warned(tmp_path, caplog):
    def body(ck, state, model, opt, step):
        step += 1
        ck.maybe_save(state, step)  # before this step's update: holds step - 1's parameters
        update(model, opt)
        return step

    run(tmp_path, body)
    assert warnings_of(tmp_path / "run") == [SAVE_BEFORE_STEP]
    assert "maybe_save(1) ran before optimizer.step() of its step" in caplog.text


def test_a_save_after_its_update_is_not(tmp_path):
    def body(ck, state, model, opt, step):
        update(model, opt)
        step += 1
        ck.maybe_save(state, step)
        return step

    run(tmp_path, body)
    assert warnings_of(tmp_path / "run") == []


@pytest.mark.parametrize(
    ("generator", "after_save", "warned"),
    [(None, True, True), (torch.Generator, True, False), (None, False, False)],
    ids=["global-after-save", "own-generator", "global-before-save"],
)
def test_a_test_loader_on_the_global_stream_after_a_save_is_warned(
    tmp_path, generator, after_save, warned, caplog
):
    test = torch.utils.data.DataLoader(
        torch.arange(8.0), batch_size=4, generator=generator() if generator else None
    )

    def body(ck, state, model, opt, step):
        update(model, opt)
        step += 1
        if not after_save:
            sum(float(x.sum()) for x in test)  # the test pass before the step's save
        ck.maybe_save(state, step)
        if after_save:
            sum(float(x.sum()) for x in test)  # an epoch's test pass after its last save
        return step

    run(tmp_path, body)
    assert (LOADER_AFTER_SAVE in warnings_of(tmp_path / "run")) is warned
    assert ("without generator= started after the checkpoint of step 1" in caplog.text) is warned
    # the hook is gone with the run: DataLoader is as torch made it
    assert loaderstarts._original is None and not loaderstarts._callbacks


def test_a_hand_written_update_declares_the_optimizer_absent_and_resumes_exactly(tmp_path):
    def make() -> tuple[torch.nn.Module, LoopState, TrainState]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        carry = LoopState(momentum=[torch.zeros_like(p) for p in model.parameters()])
        absent = {**ABSENT, "optimizer": "a hand-written SGD with momentum (in the loop state)"}
        return model, carry, TrainState(model=model, loop=carry, absent=absent)

    def train(run_dir, until: int) -> torch.Tensor:
        model, carry, state = make()
        with Checkpointer(CheckpointConfig(every_steps=3), run_dir, final_step=9) as ck:
            step = ck.restore(state, "latest")
            while step < until:
                model.zero_grad()
                loss = model(torch.randn(8, 4)).pow(2).mean()
                loss.backward()
                with torch.no_grad():
                    for p, m in zip(model.parameters(), carry.momentum, strict=True):
                        m.mul_(0.9).add_(p.grad)
                        p.sub_(0.1 * m)
                step += 1
                ck.record(step, loss=loss.item())
                ck.maybe_save(state, step)
        return model.weight.detach().clone()

    whole = train(tmp_path / "whole", 9)
    train(tmp_path / "cut", 5)  # stops after step 5: the last checkpoint is step 3
    assert torch.equal(train(tmp_path / "cut", 9), whole)
    (check,) = [
        r for r in read(tmp_path / "cut" / "metrics.jsonl") if r.get("event") == "resume_check"
    ]
    assert (check["status"], check["identical"]) == ("exact", 2)
