"""One process's save strategies: :class:`Inline` writes on the training thread,
:class:`Background` on the background writer from reused staging buffers; what a save
cost (:class:`Cost`). Chosen by :func:`recovery.run.writing.strategies.choose`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from recovery.errors import StorageError
from recovery.format.manifest import Manifest
from recovery.integrity.commits import full
from recovery.integrity.keys.signing import Signer
from recovery.run import policy
from recovery.run.writing.background import BackgroundWriter
from recovery.run.writing.job import SaveJob, Tensors, split
from recovery.run.writing.staging import Staging
from recovery.state.registry import TrainState


@dataclass(frozen=True)
class Cost:
    """What one committed save cost."""

    pause_s: float
    """Time the training thread was held (the whole write when synchronous)."""
    wait_s: float
    """Time it waited for the previous save first."""
    write_s: float
    """From the tensors in hand to the committed directory."""
    mode: str
    """``sync``, ``async`` or ``promoted`` (a local snapshot copied to the run directory:
    :mod:`recovery.run.tiers.rules`)."""

    @property
    def planned_s(self) -> float:
        """What ``checkpoint.interval=auto`` plans the persistent interval with: the pause,
        but for a promotion (whose pause is its local snapshot's) the persistent write."""
        return self.write_s if self.mode == "promoted" else self.pause_s

    def event(self, step: int, nbytes: int) -> dict[str, Any]:
        """The journal's ``checkpoint`` record."""
        return {
            "event": "checkpoint",
            "step": step,
            "mode": self.mode,
            "pause_s": self.pause_s,
            "wait_s": self.wait_s,
            "write_s": self.write_s,
            "bytes": nbytes,
            "throughput_mb_s": nbytes / self.write_s / 1e6 if self.write_s > 0 else None,
            # what a failure now could lose, in intervals (policy.max_loss_intervals): a
            # promotion, like an async save, is written while the run goes on
            "max_loss_intervals": policy.max_loss_intervals(self.mode != "sync"),
            **({"promoted_from": "local"} if self.mode == "promoted" else {}),
        }


Committed = Callable[[SaveJob, Manifest, Cost], None]


class Inline:
    """Writes on the training thread: the pause is the whole write.

    A state on an accelerator goes through the asynchronous save's pipeline, then its
    wait: copied at once into reused (pinned, under CUDA) host buffers, then encoded,
    hashed and written from them, so a synchronous save costs what an asynchronous one
    costs in all, not a device-to-host copy per tensor on the way. A state on the host is
    written as it is (a copy would only add to the pause).
    """

    def __init__(self, signer: Signer, committed: Committed) -> None:
        self.signer = signer
        self.committed = committed
        self.persisted: int | None = None
        """The newest step this saver saw committed on every rank (:class:`Ranks`: where
        ``committed`` runs on rank 0 only)."""
        self._staging = Staging()

    def save(self, job: SaveJob, state: TrainState, *, waited: float, sync: bool = False) -> float:
        """Write ``job`` from ``state``; return the seconds the training thread was held.

        Raises:
            PurposeError, CommitError: nothing was committed; earlier checkpoints are intact.
            StorageError: the disk is full (:func:`recovery.integrity.commits.full.refused`).
        """
        tree = state.state_dict()
        if not on_device(tree):
            return self.write_tree(job, tree, waited=waited)
        started = time.perf_counter()
        # the previous save is waited for (waited): its buffers are free
        staged = self._staging.stage(tree)
        return self._write(job, staged.skeletons, staged.tensors, started, waited, mode="sync")

    def write_tree(self, job: SaveJob, tree: dict[str, Any], *, waited: float = 0.0) -> float:
        """Write ``job`` from a state tree now, on this thread; return the seconds it took."""
        started = time.perf_counter()
        skeletons, tensors = split(tree)
        return self._write(job, skeletons, tensors, started, waited, mode="sync")

    def _write(
        self,
        job: SaveJob,
        skeletons: dict[str, Any],
        tensors: Tensors,
        started: float,
        waited: float,
        *,
        mode: str,
        pause: float | None = None,
        **commit_kw: Any,
    ) -> float:
        try:
            mf = job.write(skeletons, tensors, signer=self.signer, **commit_kw)
            write_s = time.perf_counter() - started
            cost = Cost(pause if pause is not None else write_s, waited, write_s, mode)
            self.committed(job, mf, cost)
        except Exception as err:
            # a full disk met by the commit or by what follows it (the journal's record): one
            # error, whichever it was and on whichever thread (recovery.integrity.commits.full)
            no_room = full.cause(err)
            if no_room is None or isinstance(err, StorageError):
                raise
            raise full.refused(no_room, job.final.parent) from err
        return cost.pause_s

    def wait(self) -> float:
        """Wait for the save in flight; return the seconds waited (nothing is ever in flight)."""
        return 0.0

    def raise_if_failed(self) -> None:
        """Raise a finished save's failure (an inline save raises where it runs)."""

    def status(self) -> tuple[bool, bool]:
        """``(failed, running)`` of the save in flight, as this rank sees it, for the
        checkpointer's one per-step collective (``any_of``); then :meth:`settle`."""
        return False, False

    def settle(self, *, failed: bool, running: bool) -> None:
        """Given :meth:`status` on any rank: raise a finished save's failure (one process:
        this one's own).

        Raises:
            CommitError, StorageError (a full disk): a background save failed.
        """
        self.raise_if_failed()

    def close(self) -> float:
        """Finish; return the seconds waited."""
        return 0.0


class Background(Inline):
    """Copies the state into reused staging buffers and writes on the background thread.

    The pause is the copy; the next save waits for the one in flight, so at
    most one is in the air (:class:`~recovery.run.writing.background.BackgroundWriter`).
    """

    def __init__(self, signer: Signer, committed: Committed) -> None:
        super().__init__(signer, committed)
        self._writer = BackgroundWriter()

    def save(self, job: SaveJob, state: TrainState, *, waited: float, sync: bool = False) -> float:
        """Stage ``state`` and write in the background; ``sync`` writes inline (preemption)."""
        if sync:
            return super().save(job, state, waited=waited)
        started = time.perf_counter()
        staged = self._staging.stage(state.state_dict())
        pause = time.perf_counter() - started

        def run() -> Any:
            begun = time.perf_counter()
            self._write(
                job, staged.skeletons, staged.tensors, begun, waited, mode="async", pause=pause
            )
            return job.final

        self._writer.submit(run)
        return pause

    def wait(self) -> float:
        """Wait for the save in flight; return the seconds waited.

        Raises:
            CommitError, StorageError (a full disk): it failed.
        """
        return self._writer.wait()

    def raise_if_failed(self) -> None:
        """Raise the failure of a finished background save, once.

        Raises:
            CommitError, StorageError (a full disk): it failed.
        """
        self._writer.raise_if_failed()

    def close(self) -> float:
        """Wait for the save in flight and stop the thread; return the seconds waited.

        Raises:
            CommitError, StorageError (a full disk): the last save failed.
        """
        return self._writer.close()


def on_device(tree: Any) -> bool:
    """Whether a state tree holds a tensor off the host (a GPU's)."""
    if isinstance(tree, torch.Tensor):
        return tree.device.type != "cpu"
    if isinstance(tree, dict):
        return any(on_device(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return any(on_device(v) for v in tree)
    return False
