"""Resuming a checkpoint across the ranks of a ``torchrun`` job, at any world size.

Every rank chose the same checkpoint (:func:`agree_on_resume`) and verified
the whole of it (DCP's pickle metadata included) before DCP reads a byte of
it (:func:`load_state`); DCP reshards model and optimizer onto the current
world; the global data cursor needs no resharding; per-rank RNG streams are
restored exactly on the same world size and reseeded from (seed, step, rank)
on another, which is recorded as ``resharded``. The save half of the
protocol is :mod:`recovery.parallel.multirank`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from recovery.errors import IncompatibleStateError, RecoveryError
from recovery.format.layout import DISTRIBUTED, RANK_SNAPSHOT
from recovery.parallel import rankstate, sharded
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.state import rng
from recovery.state.registry import MODEL, OPTIMIZER, RNG, TrainState, does_not_fit
from recovery.state.snapshot import Decoded

log = logging.getLogger(__name__)


def same_step(step: int) -> bool:
    """Whether every rank chose the checkpoint of the same ``step`` (-1 for none)."""
    return distributed.all_ok(step == distributed.broadcast_int(step))


def agree_on_resume(step: int, chosen: Path | None, run_dir: Path) -> None:
    """Every rank chose the same checkpoint (``step``, -1 for none) to resume from.

    Raises:
        RecoveryError: they did not (a checkpoint root that is not one shared filesystem).
    """
    if not same_step(step):
        raise RecoveryError(
            f"{run_dir}: the ranks chose different checkpoints to resume from "
            f"(this rank: {chosen or 'none'}); is the checkpoint root "
            "one shared filesystem for every node?",
            path=run_dir,
        )


def load_state(
    state: TrainState,
    decoded: Decoded,
    files: dict[str, Any],
    path: Path,
    *,
    world: World,
    seed: int,
) -> dict[str, Any] | None:
    """Restore ``state`` on the current world from a verified checkpoint: its decoded
    tree, its verified files and its path.

    Model and optimizer come from DCP when the checkpoint has them there (at
    any world size, with or without a process group), otherwise from their
    files (a single-process checkpoint resumed by a ``torchrun`` job with
    replicated state). Everything that can refuse is checked before anything
    is applied.

    Returns:
        ``{"from": old, "to": new, "rng": ...}`` when the world size changed
        (the RNG streams were reseeded), else ``None``.

    Raises:
        IncompatibleStateError, FormatError: nothing was changed.
    """
    tree = decoded.tree
    spread = decoded.meta.get(DISTRIBUTED)
    saved_size = int(spread["world_size"]) if isinstance(spread, dict) else 1
    via_dcp = isinstance(spread, dict)
    owner = decoded.meta.get(RANK_SNAPSHOT)
    if isinstance(owner, dict):  # one rank's local snapshot: that rank of that world only
        saved_size = int(owner.get("world_size", 0))
        if (int(owner.get("rank", -1)), saved_size) != (world.rank, world.size):
            raise IncompatibleStateError(
                f"{path}: is rank {owner.get('rank')}'s local snapshot of a {saved_size}-rank "
                f"job; this process is rank {world.rank} of {world.size}. Resume from the "
                "persistent tier (+resume=<step>) instead.",
                mismatches=[f"rank {owner.get('rank')} of {saved_size}"],
                path=path,
            )
    # model and optimizer by parameter name (FSDP2: this rank's shards): rankstate loads them
    # (``sharded``: an FSDP2 snapshot written before DDP's were by name too)
    named = isinstance(owner, dict) and bool(owner.get("by_name") or owner.get("sharded"))
    if not (via_dcp or named):
        sharded.refuse_plain_into_sharded(state.components.get(MODEL), path)
    plain = [n for n in state.components if not ((via_dcp or named) and n in sharded.SHARDED)]
    problems = state.mismatches(tree, only=plain)
    own: dict[str, Any] | None = None
    if saved_size == world.size:  # the same ranks: each continues its own RNG streams exactly
        own = sharded.read_rank(files, world.rank, where=path) if via_dcp else {RNG: tree[RNG]}
        problems += [f"rank {world.rank} {line}" for line in rng.validate(own.get(RNG))]
    if problems:
        raise IncompatibleStateError(
            does_not_fit(path, problems),
            mismatches=problems,
            path=path,
        )
    if named:
        rankstate.load(state.components[MODEL], state.components[OPTIMIZER], tree, where=path)
    if isinstance(spread, dict):
        sharded.load(
            state.components[MODEL],
            state.components[OPTIMIZER],
            files,
            spread.get(OPTIMIZER, {}),
            where=path,
        )
    state.load_state_dict(tree, source=str(path), only=plain)
    step = decoded.step
    if own is not None:
        rng.restore(own[RNG])
        return None
    derived = distributed.reseed(seed, step, world.rank)
    log.warning(
        "resharded: %s was saved by %d rank(s), resumed on %d; model and optimizer resharded, "
        "data cursor kept, RNG streams reseeded from (seed %d, step %d, rank %d) -> %d",
        path,
        saved_size,
        world.size,
        seed,
        step,
        world.rank,
        derived,
    )
    return {"from": saved_size, "to": world.size, "rng": "reseeded from (seed, step, rank)"}
