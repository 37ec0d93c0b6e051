"""Peer replicas of the local tier under ``torchrun``: who holds whose snapshot, and which
step a restarted job can restore from its nodes' RAM (pure policies; the transfers are
:mod:`recovery.parallel.transfer`, the tier :mod:`recovery.run.tiers.peers`).

Layout, under a run's node-local directory (``<root>/<run name>-<digest>/``, one per node):
``rank<r>/step-N/`` is rank ``r``'s own snapshot, ``replica-rank<r>/step-N/`` a copy of it
held on this node for a peer. A directory's name says whose state it holds, not which
process wrote it, so a restarted job whose ranks landed on other nodes still finds them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from recovery.errors import ConfigError

OWN_PREFIX = "rank"
REPLICA_PREFIX = "replica-rank"
_NAME = re.compile(r"(rank|replica-rank)(\d+)")


def own_name(rank: int) -> str:
    """The directory of rank ``rank``'s own snapshots."""
    return f"{OWN_PREFIX}{rank}"


def replica_name(rank: int) -> str:
    """The directory of the copies of rank ``rank``'s snapshots held for it."""
    return f"{REPLICA_PREFIX}{rank}"


def owner_of(name: str) -> tuple[int, bool] | None:
    """Whose snapshots a directory of that name holds, and whether they are replicas
    (``None``: not a tier directory)."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    return int(match.group(2)), match.group(1) == REPLICA_PREFIX


def spacing(configured: int, per_node: int) -> int:
    """The replica spacing: ``checkpoint.local.replica_spacing``, or (0) the ranks per node."""
    return configured if configured > 0 else max(1, per_node)


def offsets(replicas: int, space: int, world_size: int) -> list[int]:
    """How far (in ranks, modulo ``world_size``) each of a rank's ``replicas`` copies goes.

    Raises:
        ConfigError: two copies would land on one rank, or on the rank itself (one line
            naming the keys, with values that fit).
    """
    found = [k * space % world_size for k in range(1, replicas + 1)]
    if any(o == 0 for o in found) or len(set(found)) != len(found):
        most = world_size // math.gcd(space, world_size) - 1
        raise ConfigError(
            f"checkpoint.local.replicas={replicas} with replica spacing {space} on "
            f"{world_size} ranks puts a copy on its own rank or two on one; set "
            f"checkpoint.local.replicas at most {most} (0: none), or another "
            "checkpoint.local.replica_spacing"
        )
    return found


def destinations(rank: int, world_size: int, offs: Sequence[int]) -> list[int]:
    """The ranks that hold copies of ``rank``'s snapshots."""
    return [(rank + o) % world_size for o in offs]


def sources(rank: int, world_size: int, offs: Sequence[int]) -> list[int]:
    """The ranks whose snapshots ``rank`` holds copies of (in the order of ``offs``)."""
    return [(rank - o) % world_size for o in offs]


@dataclass(frozen=True)
class Plan:
    """The step every rank restores from the local tier, and who gives each rank's snapshot."""

    step: int
    holders: dict[int, int]
    """For each rank (owner), the rank that has its snapshot on its node: the owner itself
    when it can, else the lowest rank that can; the owner then receives it from there."""

    def transfers(self) -> list[tuple[int, int]]:
        """``(owner, holder)`` pairs that cross ranks, in one order every rank agrees on."""
        return sorted((o, h) for o, h in self.holders.items() if o != h)


def newest_complete(
    listings: Sequence[Mapping[int, Sequence[int]]], world_size: int
) -> Plan | None:
    """The newest step for which every rank ``0 .. world_size - 1``'s snapshot is on some
    rank's node (``listings[r]``: owner -> steps rank ``r`` sees, own or replica), with its
    holders; ``None``: no step is whole."""
    steps = sorted({s for listing in listings for held in listing.values() for s in held})
    for step in reversed(steps):
        holders = {}
        for owner in range(world_size):
            who = [r for r, listing in enumerate(listings) if step in listing.get(owner, ())]
            if not who:
                break
            holders[owner] = owner if owner in who else min(who)
        else:
            return Plan(step, holders)
    return None
