"""The checkpoint protocol across the ranks of a ``torchrun`` job: one consistent snapshot.

Save (:func:`save`), at a step boundary every rank has reached (all ranks
decide to save together, see
:meth:`~recovery.run.checkpointer.Checkpointer.maybe_save`):

1. rank 0 creates the temp directory and sends its name to the others;
2. every rank writes its own state (``ranks/rank-NNNNN.*``, fsynced);
3. the ranks agree that every one of them succeeded; if any failed, all
   stop and nothing is committed;
4. model and optimizer go through DCP into ``dcp/`` (collective: each rank
   writes the shards it holds), and each rank hashes what it wrote;
5. the ranks agree again and send rank 0 their digests; then rank 0 alone
   writes the replicated state (``state.json``, the other components,
   ``config.yaml``), hashes what no rank reported (DCP's ``.metadata``), signs
   the manifest of every file last and renames the directory into place,
   exactly as :func:`recovery.integrity.commits.commit.commit` does for one process;
6. rank 0 tells the others whether the commit happened.

What is written is a :class:`Parts`: the live state on the training thread
(a synchronous save), or host copies of it taken at the step boundary (an
async save, which runs these steps on a background thread per rank, every
collective over a gloo group of its own: :mod:`recovery.parallel.collectives`).

A rank that dies at any point (SIGKILL, OOM) breaks the next collective on
the others, so no rank reaches step 5's rename: the temp directory stays
behind, unsigned and ignored, and the next start removes it.

Load: :mod:`recovery.parallel.loading`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery import faults
from recovery.errors import CommitError, ConfigError, RecoveryError
from recovery.format.layout import DCP_DIR, DISTRIBUTED, temp_dir_for
from recovery.format.manifest import FileRecord
from recovery.integrity import nofollow
from recovery.parallel import sharded
from recovery.parallel.collectives import WORLD, Collectives

# the load half moved to recovery.parallel.loading; these names stay for its callers
from recovery.parallel.world import World
from recovery.state import rng
from recovery.state.registry import MODEL, OPTIMIZER, RNG, TrainState

LeaderCommit = Callable[[Path, Sequence[str | FileRecord], dict[str, Any]], None]
"""Rank 0's commit: ``(temp dir, files to adopt, the distributed metadata)``: writes the
replicated state, lists and signs every file, renames."""


def describe(world: World, strategy: str, groups: dict[str, Any]) -> dict[str, Any]:
    """The ``state.json`` record of a distributed checkpoint."""
    return {
        "world_size": world.size,
        "strategy": strategy,
        "sharded": list(sharded.SHARDED),
        "per_rank": list(sharded.PER_RANK),
        "dcp": DCP_DIR,
        OPTIMIZER: groups,
    }


@dataclass(frozen=True)
class Parts:
    """What one rank writes of one save, besides rank 0's replicated components."""

    own: dict[str, Any]
    """This rank's own state (its RNG streams), for ``ranks/rank-NNNNN.*``."""
    tensors: dict[str, Any]
    """What DCP writes: ``{"model": ..., "optimizer": ...}``, FSDP2's tensors as DTensors."""
    groups: dict[str, Any]
    """The optimizer's param groups, for ``state.json``."""


def live_parts(state: TrainState) -> Parts:
    """What this rank writes of ``state``, as it is now: its RNG streams (captured), DCP's
    view of model and optimizer (the live tensors, not copies) and the param groups."""
    tensors, groups = sharded.state_of(state.components[MODEL], state.components[OPTIMIZER])
    return Parts({RNG: rng.capture()}, tensors, groups)


def save(
    parts: Parts,
    final: Path,
    world: World,
    step: int,
    *,
    strategy: str,
    commit: LeaderCommit,
    comm: Collectives = WORLD,
) -> None:
    """The whole protocol on this rank (every rank calls it for the same step): steps 1-5
    (:func:`write_parts`), ``commit`` on rank 0, then step 6 (:func:`announce`).

    Raises:
        CommitError: some rank failed; the step is abandoned on every rank.
    """
    tmp, hashed = write_parts(final, world, step, own=parts.own, tensors=parts.tensors, comm=comm)
    committed = False
    try:
        if world.leader:
            commit(
                tmp, adopted(tmp, hashed), {DISTRIBUTED: describe(world, strategy, parts.groups)}
            )
        committed = True
    finally:
        announce(world, committed, final, step, comm=comm)


def write_parts(
    final: Path,
    world: World,
    step: int,
    *,
    own: dict[str, Any],
    tensors: dict[str, Any],
    comm: Collectives = WORLD,
) -> tuple[Path, list[FileRecord]]:
    """Steps 1-5 up to rank 0's commit: every rank's files and the DCP shards, agreed.

    Every rank calls it for the same step. Its collectives, DCP's included,
    run over ``comm`` (the job's group on the training thread; a group of
    their own on a background thread).

    Args:
        own: this rank's own state (``ranks/rank-NNNNN.*``).
        tensors: what DCP writes (:func:`live_parts`, or host copies of it).

    Returns:
        The temp directory (complete on every rank's side) and the records
        (name, sha256, size) of the files the ranks wrote, each hashed by its writer.

    Raises:
        CommitError: this or another rank failed; nothing was committed.
    """
    tmp = final.with_name(comm.broadcast_text(temp_dir_for(final).name if world.leader else ""))
    failure: BaseException | None = None
    try:
        if world.leader:
            tmp.mkdir()
            nofollow.Made.register(tmp)  # the commit checks it is still this directory
    except OSError as err:
        failure = err
    _agree(
        failure,
        "create the temp directory",
        tmp=tmp,
        world=world,
        final=final,
        step=step,
        comm=comm,
    )
    own_records: list[FileRecord] = []
    try:
        own_records = sharded.write_rank(tmp, world.rank, own)
        faults.reach(f"rank-{world.rank}-write-{step}")
    except (OSError, RecoveryError) as err:
        failure = err
    _agree(failure, "write its state", tmp=tmp, world=world, final=final, step=step, comm=comm)
    written: dict[str, tuple[str, int]] = {}
    try:
        written = sharded.write(tensors, tmp / DCP_DIR, process_group=comm.process_group)
    except BaseException as err:  # DCP's wrapper of the ranks' failures is a BaseException
        if not sharded.dcp_failure(err):
            raise
        _abandon(tmp, world)
        raise CommitError(
            f"step {step}: the sharded save failed ({sharded.failure(err)}); "
            "nothing was committed and earlier checkpoints are intact.",
            path=final,
        ) from err
    faults.reach(f"rank-{world.rank}-sharded-{step}")
    # each rank hashed what it wrote while fsync waited for the disk, and sends rank 0 the
    # digests: rank 0 reading every rank's shards back would be the whole checkpoint's size
    # in reads on one node, and a rank reading its own back after the save cost a third of a
    # bare dcp.save (measured)
    records = [
        *own_records,
        *(FileRecord(f"{DCP_DIR}/{name}", *record) for name, record in written.items()),
    ]
    gathered = comm.gather_text(json.dumps([[r.name, r.digest, r.size] for r in records]))
    every = [
        FileRecord(str(n), str(h), int(s)) for text in gathered for n, h, s in json.loads(text)
    ]
    return tmp, every


def _agree(
    failure: BaseException | None,
    doing: str,
    *,
    tmp: Path,
    world: World,
    final: Path,
    step: int,
    comm: Collectives,
) -> None:
    """Continue only if every rank succeeded; otherwise abandon the save on all of them."""
    if comm.all_ok(failure is None):
        return
    _abandon(tmp, world)
    raise CommitError(
        f"step {step}: a rank could not {doing}"
        + (f" (this rank: {failure})" if failure else "")
        + "; nothing was committed and earlier checkpoints are intact.",
        path=final,
    ) from failure


def adopted(tmp: Path, hashed: list[FileRecord]) -> list[str | FileRecord]:
    """Every file in ``tmp``: the records the ranks sent, and the names of the rest (none
    when DCP's writer reported every file it wrote), which rank 0 hashes.

    Raises:
        CommitError: a rank reported a file that is not there.
    """
    present = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    missing = sorted({r.name for r in hashed} - set(present))
    if missing:
        raise CommitError(f"{tmp}: ranks reported {missing}, which are not there", path=tmp)
    known = {r.name for r in hashed}
    return [*hashed, *(name for name in present if name not in known)]


def announce(
    world: World, committed: bool, final: Path, step: int, *, comm: Collectives = WORLD
) -> None:
    """Step 6: rank 0 tells every rank whether it committed; the others raise if not."""
    if comm.broadcast_int(int(committed)) == 0 and not world.leader:
        raise CommitError(
            f"step {step}: rank 0 could not commit {final}; nothing was committed.", path=final
        )


def _abandon(tmp: Path, world: World) -> None:
    if world.leader:
        nofollow.Made.forget(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def check_supported(
    world: World,
    *,
    async_save: bool,
    warm_start_every: int,
    hash_type: str = "sha256",
    differential: bool = False,
) -> None:
    """Refuse the options the distributed protocol does not implement yet, by name.

    ``async_save`` is accepted either way
    (:class:`~recovery.run.writing.strategies.RanksBackground`); it stays a parameter so the
    callers need not change when an option joins or leaves.
    """
    if not world.distributed:
        return
    if hash_type != "sha256":
        raise ConfigError(
            f"checkpoint.hash={hash_type} is not supported under torchrun yet (each rank "
            "hashes its DCP shards with sha256); set checkpoint.hash=sha256"
        )
    if differential:
        raise ConfigError(
            "checkpoint.differential.enabled=true is not supported under torchrun yet (DCP "
            "writes each rank's shards whole); set checkpoint.differential.enabled=false"
        )
    if warm_start_every:
        raise ConfigError(
            "checkpoint.warm_start_every is not supported under torchrun yet; "
            "export or warm-start from a continuation checkpoint instead"
        )
