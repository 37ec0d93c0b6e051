"""Where a save runs: inline, on the background writer, or across the ranks of a job.

One strategy is chosen when the checkpointer is assembled (:func:`choose`), and
each :class:`~recovery.run.writing.job.SaveJob` is handed to it; the strategy obtains
the state's tensors its own way, writes the job, and reports the commit with its
:class:`Cost` to the ``committed`` callback it was given
(:class:`~recovery.run.saving.aftercommit.AfterCommit`: lineage, retention, cost
record, DVC). Rejected: ``if distributed / elif async`` branches in the save path,
which made every new way of saving another branch through the checkpointer.
"""

from __future__ import annotations

from recovery.integrity.keys.signing import Signer
from recovery.parallel.world import World
from recovery.run.writing.oneprocess import Background, Committed, Cost, Inline, on_device
from recovery.run.writing.ranks import Ranks, RanksBackground

__all__ = [
    "Background",
    "Committed",
    "Cost",
    "Inline",
    "Ranks",
    "RanksBackground",
    "choose",
    "on_device",
]


def choose(
    *, async_save: bool, world: World, strategy: str, signer: Signer, committed: Committed
) -> Inline:
    """The one place that decides where this run's saves run."""
    if world.distributed:
        kind = RanksBackground if async_save else Ranks
        return kind(signer, committed, world, strategy)
    if async_save:
        return Background(signer, committed)
    return Inline(signer, committed)
