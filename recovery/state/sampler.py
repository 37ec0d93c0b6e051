"""A resumable, seeded sampler whose whole position is three integers.

The cursor is global: ``(epoch, offset)`` counts examples of the global batch
stream, and each epoch's order is a permutation drawn from a generator seeded
by ``(seed, epoch)`` alone. Resuming therefore recomputes the epoch's
permutation and seeks to ``offset``: no consumed batch is replayed, none is
skipped, and the order does not depend on any global RNG the training step
also draws from.

Rejected: a ``DataLoader`` with ``shuffle=True``. Its order comes from the
global torch generator at iterator creation, and its position cannot be saved.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from recovery.errors import ConfigError, IncompatibleStateError


def _absorb(h: Any, ids: Any) -> None:
    h.update(np.asarray(ids, dtype="<i8").tobytes())


def batch_digest(ids: Any) -> str:
    """The digest a per-step record keeps of the example ids a step consumed (16 hex
    digits of their sha256 as little-endian int64): equal exactly when the ids are, at
    16 bytes a step instead of the ids themselves."""
    h = hashlib.sha256()
    _absorb(h, ids)
    return h.hexdigest()[:16]


class ResumableSampler:
    """Yields batches of example ids in a seeded per-epoch order.

    A batch never crosses an epoch boundary: the last batch of an epoch is
    shorter unless ``drop_last``. After the last batch of an epoch the cursor
    moves to ``(epoch + 1, 0)``, so a checkpoint taken there resumes at the
    new epoch's first batch.

    Args:
        num_examples: size of the dataset.
        batch_size: global batch size.
        seed: shuffle seed; epoch ``e`` uses the permutation of ``(seed, e)``.
        drop_last: drop a short final batch of each epoch.
        shuffle: ``False`` visits the examples in index order every epoch.
    """

    def __init__(
        self,
        num_examples: int,
        batch_size: int,
        seed: int,
        *,
        drop_last: bool = False,
        shuffle: bool = True,
    ) -> None:
        if num_examples <= 0:
            raise ConfigError(f"sampler: num_examples must be positive, got {num_examples}")
        if batch_size <= 0:
            raise ConfigError(f"sampler: batch_size must be positive, got {batch_size}")
        if drop_last and batch_size > num_examples:
            raise ConfigError(
                f"sampler: batch_size {batch_size} exceeds num_examples {num_examples} "
                "with drop_last: no batch would ever be produced"
            )
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.seed = seed
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.epoch = 0
        self.offset = 0
        self.batch_index = -1
        """The index in its epoch of the batch last handed out, from 0 (-1: none yet): the
        same after a resume, where a loop's own ``enumerate`` restarts at 0."""
        self._order: np.ndarray | None = None
        self._order_epoch = -1
        self._drawn: Any = None  # sha256 of the ids drawn since take_drawn()
        self.epoch_ended = False
        """Whether the batch just drawn was its epoch's last (the cursor moved to the next
        epoch): where a loop does its epoch-end work, before that step's ``maybe_save``."""

    def _epoch_end(self) -> int:
        if self.drop_last:
            return self.num_examples - self.num_examples % self.batch_size
        return self.num_examples

    def order(self, epoch: int) -> np.ndarray:
        """The permutation of example ids for ``epoch`` (pure function of seed and epoch)."""
        if self._order_epoch != epoch or self._order is None:
            self._order = (
                np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)
                if self.shuffle
                else np.arange(self.num_examples)
            )
            self._order_epoch = epoch
        return self._order

    def next_batch(self) -> tuple[int, np.ndarray]:
        """Return ``(epoch, ids)`` of the next batch and advance the cursor past it."""
        epoch = self.epoch
        end = min(self.offset + self.batch_size, self._epoch_end())
        ids = self.order(epoch)[self.offset : end].copy()
        self.batch_index = self.offset // self.batch_size
        self.offset = end
        self.epoch_ended = self.offset >= self._epoch_end()
        if self.epoch_ended:
            self.epoch += 1
            self.offset = 0
        if self._drawn is None:
            self._drawn = hashlib.sha256()
        _absorb(self._drawn, ids)
        return epoch, ids

    def take_drawn(self) -> str | None:
        """The :func:`batch_digest` of every id drawn since the last call (``None``: none),
        so a step that drew several micro-batches, or fetched the next step's batch
        ahead, is recorded by what it drew."""
        drawn, self._drawn = self._drawn, None
        return drawn.hexdigest()[:16] if drawn is not None else None

    def rest_of_epoch(self) -> list[np.ndarray]:
        """The ids of every batch left in the current epoch, without moving the cursor.

        What a ``DataLoader`` is handed as its ``batch_sampler``: prefetching workers
        may run ahead, but the cursor (the checkpointed position) moves only as the
        loop consumes batches (:meth:`next_batch`).
        """
        order, end = self.order(self.epoch), self._epoch_end()
        return [
            order[start : min(start + self.batch_size, end)].copy()
            for start in range(self.offset, end, self.batch_size)
        ]

    def peek(self) -> np.ndarray:
        """The ids of the next batch, without advancing the cursor."""
        end = min(self.offset + self.batch_size, self._epoch_end())
        return self.order(self.epoch)[self.offset : end].copy()

    def state_dict(self) -> dict[str, Any]:
        """The cursor and the parameters that give it meaning."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "offset": self.offset,
            "num_examples": self.num_examples,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
        }

    def check_state_dict(self, state: dict[str, Any]) -> list[str]:
        """Why ``state`` cannot be loaded here: a cursor over other data means other examples."""
        # checkpoints older than the shuffle option always shuffled
        saved = {"shuffle": True, **state}
        return [
            f"sampler.{key}: checkpoint {saved.get(key)!r}, this run {getattr(self, key)!r}"
            for key in ("seed", "num_examples", "batch_size", "drop_last", "shuffle")
            if saved.get(key) != getattr(self, key)
        ]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Seek to a saved cursor.

        Raises:
            IncompatibleStateError: the saved cursor was taken over a different
                dataset size, batch size or shuffle seed, so it would point to
                other examples here.
        """
        mismatches = self.check_state_dict(state)
        if mismatches:
            raise IncompatibleStateError(
                "the data cursor in the checkpoint does not fit this run's data: "
                + "; ".join(mismatches),
                mismatches=mismatches,
            )
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        self.epoch_ended = False
        self._drawn = None
