"""The process group a run trains in, and the few collectives the checkpoint protocol needs.

A run started by ``torchrun`` (``WORLD_SIZE`` and ``RANK`` in the environment)
joins a process group (gloo on CPU, nccl on GPU); a plain ``python train.py``
is a world of one and calls nothing here that communicates. Every collective
in this module carries plain integers in a tensor, never a pickled object.
Under torchrun's shared store the ranks of each attempt first agree on a
namespace of their own, so an elastic restart never meets the dead attempt's keys.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, NoReturn, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore, Store

from recovery.config import DistConfig

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place in the job."""

    rank: int = 0
    size: int = 1
    distributed: bool = False
    """A process group is initialised (``torchrun``, even with one process)."""

    @property
    def leader(self) -> bool:
        """Rank 0: the only rank that writes shared files, journals and commits."""
        return self.rank == 0


SINGLE = World()


def launched() -> bool:
    """Whether ``torchrun`` (or another launcher) started this process as one rank of a job."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def current() -> World:
    """The world as the initialised process group sees it (a world of one if none is)."""
    if not (dist.is_available() and dist.is_initialized()):
        return SINGLE
    return World(rank=dist.get_rank(), size=dist.get_world_size(), distributed=True)


def setup(cfg: DistConfig) -> World:
    """Join the job's process group if ``torchrun`` started this process; return the world."""
    if not launched():
        return SINGLE
    if not (dist.is_available() and dist.is_initialized()):
        backend = cfg.backend
        if backend == "auto":  # the recipes train on CPU tensors, which nccl cannot carry
            backend = "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        timeout = timedelta(seconds=cfg.timeout_s)
        _settings["timeout"] = timeout
        store = _attempt_store(timeout)
        if store is None:
            dist.init_process_group(backend, timeout=timeout)
        else:
            rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=size, timeout=timeout
            )
    world = current()
    log.info("rank %d of %d (%s)", world.rank, world.size, dist.get_backend())
    return world


_ATTEMPT = "recovery/attempt"
_RECHECK = timedelta(seconds=0.5)


def _attempt_store(timeout: timedelta) -> Store | None:
    """The store this attempt's process group meets in, when torchrun shares its own.

    With the c10d rendezvous (``--standalone`` included) torchrun's agent keeps one TCPStore
    for the whole job and every attempt's workers meet in it with the same keys (torch
    2.13 sets ``TORCHELASTIC_USE_AGENT_STORE=True`` and adds no per-attempt prefix,
    pytorch/pytorch#135712). After an elastic restart, a rank that joins before rank 0 has
    rewritten its address reads the dead attempt's one: gloo's connect is refused and the
    restarted job fails, or hangs (seen about every other restart, a ``--max-restarts``
    job never resuming). ``TORCHELASTIC_RESTART_COUNT`` cannot name the attempt: each agent
    counts its own restarts, and a node restarted for a membership change does not count
    it. So the ranks agree on a fresh namespace first (:func:`_agree_attempt`) and the
    process group meets under it. ``None``: not torchrun's shared store; ``env://``.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    base = dist.TCPStore(  # type: ignore[attr-defined]
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        size,
        is_master=False,
        timeout=timeout,
    )
    token = _agree_attempt(base, rank, size, timeout)
    return PrefixStore(f"{_ATTEMPT}/{token}/pg/", base)


def _agree_attempt(store: Store, rank: int, size: int, timeout: timedelta) -> str:
    """A token every rank of this attempt agrees on, which no earlier attempt used.

    Rank 0 draws it and publishes it under one key, where a rank may still read an earlier
    attempt's. So each other rank announces a fresh nonce under the token it read, and
    rank 0 waits for the announcements under its own token (a namespace nothing stale is
    in) and answers each under its nonce. A rank not answered within :data:`_RECHECK`
    reads the published token again.

    Raises:
        DistStoreError: the ranks did not all meet within ``timeout``.
    """
    current = f"{_ATTEMPT}/current"
    if rank == 0:
        token = uuid.uuid4().hex
        store.set(current, token)
        hello = [f"{_ATTEMPT}/{token}/hello/{r}" for r in range(1, size)]
        if hello:
            store.wait(hello, timeout)
        for key in hello:
            store.set(f"{_ATTEMPT}/answer/{store.get(key).decode()}", token)
        return token
    nonce = uuid.uuid4().hex
    answer = f"{_ATTEMPT}/answer/{nonce}"
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        token = store.get(current).decode()  # waits for the key (the store's timeout)
        store.set(f"{_ATTEMPT}/{token}/hello/{rank}", nonce)
        try:
            store.wait([answer], _RECHECK)
        except dist.DistStoreError:
            if time.monotonic() > deadline:
                raise
            continue
        return str(store.get(answer).decode())


def exit_now(code: int) -> NoReturn:
    """End a ``torchrun`` worker: flush output, then leave without any teardown.

    Every file the run wrote is already fsynced and closed by then, and every
    rank has passed the last collective. Skipping ``destroy_process_group`` and
    the interpreter's teardown is deliberate: destroying a gloo process group
    that a DDP reducer still uses can deadlock (its worker thread waits for the
    GIL that the destroying thread holds; seen on torch 2.13, in both places),
    leaving a finished rank hanging and the job never ending.
    """
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


_settings: dict[str, timedelta] = {}


def timeout() -> timedelta | None:
    """How long a collective waits for a missing rank, as :func:`setup` set it (``None``:
    not set up here); a group made later (a background save's) waits as long."""
    return _settings.get("timeout")


def _device(group: dist.ProcessGroup | None = None) -> torch.device:
    return torch.device("cuda") if dist.get_backend(group) == "nccl" else torch.device("cpu")


def _reduce(
    values: list[int], op: Literal["min", "max"], group: dist.ProcessGroup | None = None
) -> list[int]:
    if not current().distributed:
        return values
    t = torch.tensor(values, dtype=torch.int64, device=_device(group))
    dist.all_reduce(t, op=dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX, group=group)
    return [int(v) for v in t.tolist()]


def any_of(*flags: bool) -> list[bool]:
    """Each flag, true if it is true on any rank (one collective for all)."""
    return [bool(v) for v in _reduce([int(f) for f in flags], "max")]


def all_ok(ok: bool, *, group: dist.ProcessGroup | None = None) -> bool:
    """True only if ``ok`` on every rank (over ``group``, a group of every rank; default:
    the job's)."""
    return bool(_reduce([int(ok)], "min", group)[0])


def broadcast_int(value: int, *, group: dist.ProcessGroup | None = None) -> int:
    """Rank 0's ``value`` on every rank."""
    if not current().distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_device(group))
    dist.broadcast(t, src=0, group=group)
    return int(t.item())


def broadcast_text(text: str, *, size: int = 64, group: dist.ProcessGroup | None = None) -> str:
    """Rank 0's ``text`` (ASCII, at most ``size`` bytes) on every rank."""
    if not current().distributed:
        return text
    raw = text.encode("ascii")
    if len(raw) > size:
        raise ValueError(f"broadcast_text: {len(raw)} bytes, more than {size}")
    t = torch.zeros(size + 1, dtype=torch.uint8, device=_device(group))
    t[0] = len(raw)
    t[1 : 1 + len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    dist.broadcast(t, src=0, group=group)
    n = int(t[0].item())
    return bytes(t[1 : 1 + n].cpu().tolist()).decode("ascii")


def leader_first(fn: Callable[[], T]) -> T:
    """``fn()`` on rank 0, then (after a barrier) on the others: rank 0 creates what is missing
    (a dev key, a generated dataset) and the others read it instead of racing to create it."""
    world = current()
    result = fn() if world.leader else None
    barrier()
    return fn() if not world.leader else result  # type: ignore[return-value]


def gather_text(text: str, *, group: dist.ProcessGroup | None = None) -> list[str]:
    """Every rank's ``text`` (UTF-8), in rank order, on every rank.

    Two collectives: the longest length, then one fixed-size byte buffer per
    rank (gloo and nccl both gather tensors, not strings).
    """
    if not current().distributed:
        return [text]
    raw = text.encode()
    longest = _reduce([len(raw)], "max", group)[0]
    mine = torch.zeros(longest + 8, dtype=torch.uint8, device=_device(group))
    mine[:8] = torch.tensor(list(len(raw).to_bytes(8, "big")), dtype=torch.uint8)
    if raw:
        mine[8 : 8 + len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, mine, group=group)
    out = []
    for part in parts:
        values = part.cpu().tolist()
        n = int.from_bytes(bytes(values[:8]), "big")
        out.append(bytes(values[8 : 8 + n]).decode())
    return out


def barrier() -> None:
    """Wait for every rank (no-op in a world of one)."""
    if current().distributed:
        dist.barrier()


def mean(value: torch.Tensor) -> torch.Tensor:
    """The mean of a scalar over the ranks (the value itself in a world of one)."""
    if not current().distributed:
        return value
    t = value.detach().clone().to(_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t / dist.get_world_size()


def derived_seed(seed: int, step: int, rank: int) -> int:
    """A deterministic 63-bit seed for (run seed, step, rank)."""
    digest = hashlib.sha256(f"recovery-reseed:{seed}:{step}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def reseed(seed: int, step: int, rank: int) -> int:
    """Seed every random stream of this rank from (seed, step, rank); return the derived seed.

    Used where an exact RNG continuation does not exist: a fresh rank's own
    streams, and a resume on a different world size.
    """
    derived = derived_seed(seed, step, rank)
    random.seed(derived)
    np.random.seed(derived % 2**32)
    torch.manual_seed(derived)
    return derived
