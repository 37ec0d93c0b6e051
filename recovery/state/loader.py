"""ResumableLoader: a DataLoader over a map-style dataset whose position is part of the state.

A plain ``DataLoader(shuffle=True)`` cannot be resumed exactly: its order is
drawn from a generator when each epoch's iterator starts, its position is
nowhere, and worker-side augmentation draws from per-worker generators whose
streams restart, shifted, when a resumed run starts its workers mid-epoch.
:class:`ResumableLoader` keeps the torch ``DataLoader`` (workers, collation,
pinning, prefetching) and replaces the three things that break a resume:

- the order is a :class:`~recovery.state.sampler.ResumableSampler`'s (a pure
  function of ``(seed, epoch)``), and the ``DataLoader`` is handed the rest of
  the current epoch's batches as a fixed list, so the position is captured
  without replaying a batch;
- the cursor moves when the loop is handed a batch, not when a worker
  prefetches it, so a checkpoint holds exactly the batches trained on;
- with ``keyed_rng`` (the default) every example is loaded with torch's CPU
  generator, numpy's global generator and Python's ``random`` seeded from
  ``(seed, epoch, index)`` alone, so random augmentation inside
  ``__getitem__`` is the same in any worker, with any ``num_workers``, after
  any resume (in the training process the three generators are put back
  afterwards: the training step's streams are untouched).
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    get_worker_info,
)

from recovery.errors import ConfigError
from recovery.state.sampler import ResumableSampler

log = logging.getLogger(__name__)

RESERVED = ("sampler", "batch_sampler", "shuffle", "batch_size", "drop_last", "generator")
"""DataLoader arguments the position owns; passing them is a mistake, not an override."""


def example_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one example's augmentation: a pure function of its key, 63 bits."""
    digest = hashlib.sha256(f"{seed}:{epoch}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class _Keyed(Dataset[Any]):
    """Loads ``dataset[index]`` for a key ``(epoch, index)``, its RNG seeded from the key."""

    def __init__(self, dataset: Any, seed: int, keyed_rng: bool) -> None:
        self.dataset = dataset
        self.seed = seed
        self.keyed_rng = keyed_rng

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        if not self.keyed_rng:
            return self.dataset[index]
        in_trainer = get_worker_info() is None
        if in_trainer:  # the training step's streams must not see the augmentation
            saved = (torch.default_generator.get_state(), np.random.get_state(), random.getstate())
        k = example_seed(self.seed, epoch, index)
        torch.default_generator.manual_seed(k)
        np.random.seed(k % 2**32)
        random.seed(k)
        try:
            return self.dataset[index]
        finally:
            if in_trainer:
                torch.default_generator.set_state(saved[0])
                np.random.set_state(saved[1])
                random.setstate(saved[2])


class _RestOfEpoch:
    """A ``DataLoader``'s batch sampler: at each pass's start, the keys ``(epoch, index)``
    of the batches left in the current epoch (prefetching workers never move the
    position: the loop's taking a batch does)."""

    def __init__(self, sampler: ResumableSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch = self.sampler.epoch
        batches = [[(epoch, int(i)) for i in ids] for ids in self.sampler.rest_of_epoch()]
        return iter(batches)

    def __len__(self) -> int:
        return len(self.sampler.rest_of_epoch())


class ResumableLoader:
    """Iterates like a ``DataLoader`` over a map-style dataset; its position is saved state.

    Register it in the :class:`~recovery.state.registry.TrainState` like any
    component. Each ``for batch in loader`` yields the rest of the current
    epoch (the whole epoch after its end, the remainder after a resume), so a
    loop written ``while step < total: for batch in loader: ...`` resumes
    mid-epoch without change. Restore the state before iterating.

    Args:
        dataset: a map-style dataset (``__getitem__`` and ``__len__``).
        batch_size: examples per batch.
        seed: the order's and the augmentation's seed.
        shuffle: a new order each epoch (``False``: index order).
        drop_last: drop each epoch's short last batch.
        keyed_rng: seed torch/numpy/random from ``(seed, epoch, index)`` for each example.
        **loader_kwargs: passed to every ``DataLoader`` (``num_workers``,
            ``collate_fn``, ``pin_memory``, ``worker_init_fn``, ``timeout``, ...);
            the order's own arguments (``sampler``, ``shuffle``, ...) are refused.

    Workers start once per pass (each epoch, and once at a resume), or once for the
    run with ``persistent_workers=True`` (one ``DataLoader`` for every pass, its
    batch sampler handing out the rest of the current epoch at each pass's start).
    The batches are the same either way: each example's augmentation is seeded from
    its key, not from the worker that loads it.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
        keyed_rng: bool = True,
        **loader_kwargs: Any,
    ) -> None:
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
            raise ConfigError(
                f"ResumableLoader: {type(dataset).__name__} is not a map-style dataset "
                "(__getitem__ and __len__); for an iterable dataset use torchdata's "
                "StatefulDataLoader, registered as it is"
            )
        bad = sorted(set(loader_kwargs) & set(RESERVED))
        if bad:
            raise ConfigError(
                f"ResumableLoader: {', '.join(bad)} cannot be passed: the resumable "
                "position owns the order (use seed=, shuffle=, drop_last=)"
            )
        self.dataset = dataset
        self.sampler = ResumableSampler(
            len(dataset), batch_size, seed, drop_last=drop_last, shuffle=shuffle
        )
        self.keyed_rng = keyed_rng
        self.loader_kwargs = loader_kwargs
        self._persistent: DataLoader[Any] | None = None
        """The one ``DataLoader`` of every pass, with ``persistent_workers=True``."""
        self.last_ids: list[int] = []
        """The dataset indices of the batch last handed out (to journal them, say)."""

    @classmethod
    def from_loader(cls, loader: DataLoader[Any], *, seed: int | None = None) -> ResumableLoader:
        """A resumable loader with the settings of an existing ``DataLoader``.

        Its dataset, batch size, shuffling, ``drop_last``, workers, collation,
        pinning, ``worker_init_fn``, timeout and prefetching are kept. The seed is
        ``seed``, else the loader's ``generator=``'s, else (with a warning: the
        order then depends on how the process seeded torch) ``torch.initial_seed()``.

        Raises:
            ConfigError: an iterable dataset, a custom sampler or batch sampler, or
                sampling with replacement: orders this class cannot reproduce.
        """
        sampler = loader.sampler
        if (
            not isinstance(loader.batch_sampler, BatchSampler)
            or loader.batch_size is None
            or not isinstance(sampler, RandomSampler | SequentialSampler)
            or (
                isinstance(sampler, RandomSampler) and (sampler.replacement or sampler._num_samples)
            )
        ):
            raise ConfigError(
                f"ResumableLoader.from_loader: a DataLoader with {type(sampler).__name__} "
                "cannot be resumed exactly here (supported: batch_size= with shuffle=True "
                "or False over a map-style dataset); use torchdata's StatefulDataLoader"
            )
        generator = loader.generator or getattr(sampler, "generator", None)
        if seed is None and generator is None:
            seed = torch.initial_seed()
            log.warning(
                "ResumableLoader.from_loader: the DataLoader has no generator=; its order "
                "is seeded from torch.initial_seed() (%d); pass seed= to fix it",
                seed,
            )
        elif seed is None:
            seed = int(generator.initial_seed())  # type: ignore[union-attr]
        kwargs: dict[str, Any] = {
            "num_workers": loader.num_workers,
            "collate_fn": loader.collate_fn,
            "pin_memory": loader.pin_memory,
            "timeout": loader.timeout,
            "worker_init_fn": loader.worker_init_fn,
            "multiprocessing_context": loader.multiprocessing_context,
        }
        if loader.num_workers > 0:
            kwargs["prefetch_factor"] = loader.prefetch_factor
            kwargs["persistent_workers"] = loader.persistent_workers
        return cls(
            loader.dataset,
            loader.batch_size,
            seed=seed,
            shuffle=isinstance(sampler, RandomSampler),
            drop_last=loader.drop_last,
            **kwargs,
        )

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self.sampler.epoch

    def __len__(self) -> int:
        """Batches in a whole epoch."""
        n, b = self.sampler.num_examples, self.sampler.batch_size
        return n // b if self.sampler.drop_last else -(-n // b)

    def __iter__(self) -> Iterator[Any]:
        loader = self._persistent or DataLoader(
            _Keyed(self.dataset, self.sampler.seed, self.keyed_rng),
            batch_sampler=_RestOfEpoch(self.sampler),
            # starting a loader draws its workers' base seed: from this generator, never
            # the global one, or each resume would shift the training step's RNG stream
            generator=torch.Generator().manual_seed(self.sampler.seed),
            **self.loader_kwargs,
        )
        if self.loader_kwargs.get("persistent_workers"):
            self._persistent = loader  # its workers stay up; each pass resets its batches
        for batch in loader:
            _, ids = self.sampler.next_batch()  # the position moves as the loop takes a batch
            self.last_ids = [int(i) for i in ids]
            yield batch

    @property
    def batch_index(self) -> int:
        """The index in its epoch of the batch last handed out, from 0 (-1: none yet).

        What ``for i, batch in enumerate(loader)`` means by ``i`` in a run never
        interrupted, but the same after a resume, where ``enumerate`` restarts at 0 in
        the middle of an epoch: gate periodic work on this (or on the step)."""
        return self.sampler.batch_index

    @property
    def epoch_ended(self) -> bool:
        """Whether the batch just handed out was its epoch's last: the place for an epoch's
        end work (a per-epoch scheduler, a test pass), before that step's ``maybe_save``."""
        return self.sampler.epoch_ended

    def take_drawn(self) -> str | None:
        """The digest of the example ids handed out since the last call
        (:meth:`~recovery.state.sampler.ResumableSampler.take_drawn`)."""
        return self.sampler.take_drawn()

    def peek(self) -> list[int]:
        """The dataset indices of the next batch, without moving the position."""
        return [int(i) for i in self.sampler.peek()]

    def state_dict(self) -> dict[str, Any]:
        """The position (epoch, offset) and what gives it meaning."""
        return {**self.sampler.state_dict(), "keyed_rng": self.keyed_rng}

    def check_state_dict(self, state: Any) -> list[str]:
        """Why ``state`` cannot be loaded here: a position over other data or another order."""
        if not isinstance(state, dict):
            return [f"data position: checkpoint holds a {type(state).__name__}, not a position"]
        problems = self.sampler.check_state_dict(state)
        if state.get("keyed_rng", True) != self.keyed_rng:
            problems.append(
                f"keyed_rng: checkpoint {state.get('keyed_rng')!r}, this run {self.keyed_rng!r}"
            )
        return problems

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Seek to a saved position (call before iterating).

        Raises:
            IncompatibleStateError: the position was taken over other data.
        """
        self.sampler.load_state_dict({k: v for k, v in state.items() if k != "keyed_rng"})
