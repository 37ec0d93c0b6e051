"""What the local tier's RAM check counts for one rank (issue 30): how many snapshot-sized
copies it keeps, which of those already there are replaced rather than added, and, under
``torchrun``, one verdict for every rank (:func:`agreed`). The check itself is
:func:`recovery.run.tiers.rules.fit`; :class:`~recovery.run.tiers.snapshots.LocalTier` runs it at
start-up and again with the first snapshot's real size."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from recovery.errors import StorageError
from recovery.run.tiers import rules
from recovery.run.tiers.peers import Peers


def copies(peers: Peers | None) -> int:
    """The snapshot-sized copies a rank keeps at most: its own (:data:`~recovery.run.tiers.rules.
    HELD`) and under ``torchrun`` its peers' (:meth:`~recovery.run.tiers.peers.Peers.copies`),
    for every rank of the node (they share its RAM)."""
    if peers is None:
        return rules.HELD
    return (rules.HELD + peers.copies()) * len(peers.node_ranks)


def freeable(peers: Peers | None, held: Sequence[tuple[int, Path]]) -> list[Path]:
    """The snapshots whose room the check counts as free (they are replaced): this rank's
    (``held``: step, path), or under ``torchrun`` every one in the node's run directory."""
    return peers.node_held() if peers is not None else [path for _, path in held]


def agreed(peers: Peers | None, check: Callable[[], object]) -> None:
    """Run a RAM ``check`` of the local tier; under ``torchrun`` (``peers``) every rank
    refuses together (:meth:`Peers.agree_on_room`: collective on the job's group).

    Raises:
        StorageError: this rank's check, or another rank's, refused.
    """
    try:
        check()
    except StorageError as err:
        if peers is not None:
            peers.agree_on_room(err)
        raise
    if peers is not None:
        peers.agree_on_room(None)
