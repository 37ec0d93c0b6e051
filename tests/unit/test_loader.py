"""The data pipelines users have: ResumableLoader, a DataLoader's settings, a StatefulDataLoader."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, WeightedRandomSampler

from recovery.config import CheckpointConfig
from recovery.errors import ConfigError
from recovery.run.checkpointer import Checkpointer
from recovery.state.loader import ResumableLoader
from recovery.state.registry import TrainState


class Noisy(Dataset[tuple[torch.Tensor, int]]):
    """Augmentation drawing from all three global generators, as user datasets do."""

    def __len__(self) -> int:
        return 21

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        jitter = torch.randn(3) + float(np.random.rand()) + random.random()
        return torch.full((3,), float(i)) + jitter, i


def take(loader: Any, n: int) -> list[torch.Tensor]:
    """The inputs of the first ``n`` batches, crossing epoch ends as a training loop does."""
    return [x for x, _ in batches(loader, n)]


def batches(loader: Any, n: int) -> list[Any]:
    out: list[Any] = []
    while len(out) < n:
        for batch in loader:
            out.append(batch)
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_mid_epoch_yields_the_same_batches_and_augmentation(workers: int) -> None:
    ref = take(ResumableLoader(Noisy(), 4, seed=3, num_workers=workers), 9)
    first = ResumableLoader(Noisy(), 4, seed=3, num_workers=workers)
    head = take(first, 4)  # stops inside epoch 0 (6 batches per epoch)
    resumed = ResumableLoader(Noisy(), 4, seed=3, num_workers=workers)
    resumed.load_state_dict(first.state_dict())
    got = head + take(resumed, 5)  # finishes epoch 0, then 3 batches of epoch 1
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
    assert (first.epoch, resumed.epoch) == (0, 1)


def test_the_batches_do_not_depend_on_the_number_of_workers() -> None:
    inline = take(ResumableLoader(Noisy(), 5, seed=1, num_workers=0), 6)
    workers = take(ResumableLoader(Noisy(), 5, seed=1, num_workers=2), 6)
    assert all(torch.equal(a, b) for a, b in zip(inline, workers, strict=True))


def test_loading_in_the_training_process_leaves_its_generators_alone() -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    take(ResumableLoader(Noisy(), 4, seed=3), 3)
    after = (torch.rand(1), np.random.rand(), random.random())
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    assert after == (torch.rand(1), np.random.rand(), random.random())


def test_the_position_moves_as_the_loop_takes_batches_not_as_workers_prefetch() -> None:
    loader = ResumableLoader(Noisy(), 4, seed=0, num_workers=2, prefetch_factor=4)
    it = iter(loader)
    next(it)
    assert loader.state_dict()["offset"] == 4
    assert loader.peek() == [int(i) for i in next(it)[1]]


def test_from_loader_keeps_a_dataloaders_settings_and_seed() -> None:
    g = torch.Generator().manual_seed(11)
    plain = DataLoader(Noisy(), batch_size=4, shuffle=True, drop_last=True, generator=g)
    loader = ResumableLoader.from_loader(plain)
    assert (loader.sampler.seed, loader.sampler.drop_last, len(loader)) == (11, True, 5)
    assert loader.sampler.shuffle
    assert not ResumableLoader.from_loader(DataLoader(Noisy(), batch_size=4)).sampler.shuffle


def test_persistent_workers_are_kept_and_give_the_same_batches_across_epochs_and_a_resume():
    """One DataLoader, its two workers up for the whole run: each pass (the epoch's rest
    after a resume, a whole epoch after its end, a pass broken off mid-epoch) hands it
    the batches left, and every batch equals the inline loader's, bit for bit."""
    ref = take(ResumableLoader(Noisy(), 4, seed=3, num_workers=0), 14)
    kept = ResumableLoader(Noisy(), 4, seed=3, num_workers=2, persistent_workers=True)
    first = take(kept, 7)  # into the second epoch (6 batches an epoch, the last short)
    assert kept._persistent is not None and kept._persistent.persistent_workers
    workers = kept._persistent
    resumed = ResumableLoader(Noisy(), 4, seed=3, num_workers=2, persistent_workers=True)
    resumed.load_state_dict(kept.state_dict())
    rest = take(resumed, 7)
    assert all(torch.equal(a, b) for a, b in zip(ref, first + rest, strict=True))
    assert take(kept, 2) and kept._persistent is workers  # the same loader, pass after pass
    plain = DataLoader(Noisy(), batch_size=4, num_workers=1, persistent_workers=True)
    assert ResumableLoader.from_loader(plain, seed=0).loader_kwargs["persistent_workers"]


def test_batch_index_is_the_batch_s_place_in_its_epoch_across_a_resume():
    loader = ResumableLoader(Noisy(), 4, seed=0)
    assert loader.batch_index == -1
    seen = []
    for _ in range(7):
        next(iter(loader))
        seen.append(loader.batch_index)
    resumed = ResumableLoader(Noisy(), 4, seed=0)
    resumed.load_state_dict(loader.state_dict())
    for _ in range(4):
        next(iter(resumed))
        seen.append(resumed.batch_index)
    assert seen == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4]  # 6 batches an epoch, the last short


def test_from_loader_without_a_generator_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        ResumableLoader.from_loader(DataLoader(Noisy(), batch_size=4, shuffle=True))
    assert "no generator=" in caplog.text


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(4))


@pytest.mark.parametrize(
    "build",
    [
        lambda: ResumableLoader(Stream(), 2, seed=0),
        lambda: ResumableLoader(Noisy(), 2, seed=0, shuffle=True, sampler=None),
        lambda: ResumableLoader.from_loader(
            DataLoader(Noisy(), batch_size=2, sampler=WeightedRandomSampler([1.0] * 21, 21))
        ),
    ],
    ids=["iterable", "reserved", "custom-sampler"],
)
def test_orders_it_cannot_reproduce_are_refused(build: Any) -> None:
    with pytest.raises(ConfigError, match="ResumableLoader"):
        build()


def test_a_position_over_other_data_is_a_mismatch() -> None:
    saved = ResumableLoader(Noisy(), 4, seed=0).state_dict()
    assert ResumableLoader(Noisy(), 4, seed=0).check_state_dict(saved) == []
    assert ResumableLoader(Noisy(), 5, seed=0).check_state_dict(saved)
    assert ResumableLoader(Noisy(), 4, seed=0, keyed_rng=False).check_state_dict(saved)


def test_a_stateful_dataloader_with_workers_resumes_mid_epoch_through_a_checkpoint(
    tmp_path: Path,
) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def build() -> tuple[StatefulDataLoader, TrainState]:
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, 2)
        loader = StatefulDataLoader(
            Noisy(), batch_size=4, shuffle=True, num_workers=2, generator=torch.Generator()
        )
        # the continuation contract names the data position "sampler"
        return loader, TrainState(model=model, optimizer=opt, scheduler=sched, sampler=loader)

    torch.manual_seed(0)
    loader, _ = build()
    ref = [i for _, i in batches(loader, 8)]

    torch.manual_seed(0)
    loader, state = build()
    head = [i for _, i in batches(loader, 3)]
    ckpt = Checkpointer(CheckpointConfig(every_steps=1), tmp_path / "run", final_step=8)
    ckpt.restore(state, None)
    ckpt.save(state, 3, sync=True)
    ckpt.close()

    torch.manual_seed(5)  # a new process: its own seed, restored from the checkpoint
    loader, state = build()
    ckpt = Checkpointer(CheckpointConfig(every_steps=1), tmp_path / "run", final_step=8)
    assert ckpt.restore(state, "latest") == 3
    tail = [i for _, i in batches(loader, 5)]
    ckpt.close()
    assert [t.tolist() for t in head + tail] == [t.tolist() for t in ref]
