"""Shared fixtures: a tiny model's full training state, and a committed checkpoint of it."""

from __future__ import annotations

import pytest
import torch

from recovery import commit, snapshot
from recovery.layout import step_dir_name
from recovery.sampler import ResumableSampler
from recovery.state import TrainState


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


def commit_state(run_dir, state: TrainState, step: int):
    run_dir.mkdir(parents=True, exist_ok=True)
    files = snapshot.encode(
        state.state_dict(), step=step, meta={"run_id": "r"}, config_yaml="seed: 0\n"
    )
    return commit.commit(
        run_dir / step_dir_name(step), files, {"step": step, "purpose": "continuation"}
    )


@pytest.fixture
def checkpoint(tmp_path):
    """A committed checkpoint of a tiny model after 3 steps: (path, state)."""
    state = tiny_state()
    train_steps(state, 3)
    commit_state(tmp_path / "run", state, 3)
    return tmp_path / "run" / step_dir_name(3), state
